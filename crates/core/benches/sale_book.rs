//! Micro-benchmarks of the in-memory apply path (what the embedded ledger runs per request,
//! and what the Lua script mirrors), so a regression shows up: `cargo bench -p flashsale-core`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use flashsale_core::{PurchaseRequest, RequestId, Sale, SaleBook, SaleMode, SkuId, UserId};

const BATCH: u64 = 1_024;

fn book(total: u64) -> SaleBook {
    let sale = Sale::always_open(SkuId(1), total);
    let c = sale.fresh_counters();
    SaleBook::new(sale, c, 1)
}

fn batch(first_user: u64) -> Vec<PurchaseRequest> {
    (first_user..first_user + BATCH)
        .map(|u| PurchaseRequest {
            sku_id: SkuId(1),
            user_id: UserId(u),
            request_id: RequestId::parse(&format!("r{u}")).unwrap(),
            quantity: 1,
        })
        .collect()
}

fn apply(c: &mut Criterion) {
    let mut g = c.benchmark_group("sale_book");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("accept a batch of 1024", |b| {
        b.iter_batched(
            || (book(1_000_000), batch(1)),
            |(mut bk, reqs)| {
                for r in &reqs {
                    black_box(bk.purchase(r, 1));
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("refuse a sold-out batch of 1024", |b| {
        let mut bk = book(1);
        bk.purchase(&batch(0)[0], 1);
        let reqs = batch(10);
        b.iter(|| {
            for r in &reqs {
                black_box(bk.purchase(r, 1));
            }
        })
    });
    g.bench_function("replay a batch of 1024", |b| {
        let mut bk = book(1_000_000);
        let reqs = batch(1);
        reqs.iter().for_each(|r| drop(bk.purchase(r, 1)));
        b.iter(|| {
            for r in &reqs {
                black_box(bk.purchase(r, 1));
            }
        })
    });
    g.bench_function("fold the deltas of 1024 events", |b| {
        let mut bk = book(1_000_000);
        let events: Vec<_> = batch(1)
            .iter()
            .filter_map(|r| bk.purchase(r, 1).1)
            .collect();
        let start = book(1_000_000).counters;
        b.iter(|| {
            let mut c = start;
            for e in &events {
                c = c.apply(e.delta(SaleMode::Direct)).unwrap();
            }
            black_box(c)
        })
    });
    g.finish();
}

criterion_group!(benches, apply);
criterion_main!(benches);
