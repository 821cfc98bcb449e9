//! The scripts validate their own arguments: a malformed call or request changes nothing.

use crate::common::{raw, TestLedger};
use flashsale_core::{HotLedger, SaleMode, SkuId};
use flashsale_redis::{scripts, Keys};
use flashsale_testkit::conformance::{live_sale, stock, warm};
use redis::{RedisResult, Script, Value};

fn purchase_call(keys: &Keys, sku: SkuId, argv: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(scripts::PURCHASE).arg(8);
    cmd.arg(keys.sale(sku))
        .arg(keys.buyers(sku))
        .arg(keys.requests(sku))
        .arg(keys.orders(sku))
        .arg(keys.holds(sku))
        .arg(keys.events(sku))
        .arg(keys.records(sku))
        .arg(keys.batches(sku));
    cmd.arg(argv);
    cmd
}

async fn state_of(conn: &mut redis::aio::MultiplexedConnection, keys: &Keys, sku: SkuId) -> Value {
    let mut pipe = redis::pipe();
    pipe.cmd("HGETALL").arg(keys.sale(sku));
    for key in [
        keys.buyers(sku),
        keys.requests(sku),
        keys.orders(sku),
        keys.records(sku),
    ] {
        pipe.cmd("HLEN").arg(key);
    }
    pipe.cmd("ZCARD").arg(keys.holds(sku));
    pipe.cmd("ZCARD").arg(keys.batches(sku));
    pipe.cmd("XLEN").arg(keys.events(sku));
    pipe.query_async(conn).await.expect("state")
}

/// A ledger of its own and its sale's keys as they were before the test's calls.
struct Before {
    t: TestLedger,
    state: Value,
}

impl Before {
    /// Asserts that the sale's keys are as they were, and removes the ledger's keys.
    async fn unchanged(
        self,
        conn: &mut redis::aio::MultiplexedConnection,
        keys: &Keys,
        sku: SkuId,
    ) {
        assert_eq!(state_of(conn, keys, sku).await, self.state);
        self.t.cleanup().await;
    }
}

/// A sale warmed on a ledger of its own, the ledger's keys and a raw connection.
async fn warmed(
    mode: SaleMode,
    stock: u64,
    limit: u32,
) -> (Before, Keys, SkuId, redis::aio::MultiplexedConnection) {
    let t = TestLedger::new().await;
    let keys = t.ledger.keys().clone();
    let sku = warm(t.ledger.as_ref(), &live_sale(mode, stock, limit)).await;
    let mut conn = raw().await;
    let state = state_of(&mut conn, &keys, sku).await;
    (Before { t, state }, keys, sku, conn)
}

#[tokio::test]
async fn bad_quantities_are_invalid_and_change_nothing() {
    let (before, keys, sku, mut conn) = warmed(SaleMode::Reserve, 5, 3).await;
    for q in ["0", "-1", "x", "1e12", "", " 1", "1.5", "0x1", "01"] {
        let cmd = purchase_call(&keys, sku, &["1", "7", "r1", q]);
        let out: Vec<String> = cmd.query_async(&mut conn).await.expect("answered");
        assert_eq!(out[4..], ["INVALID_REQUEST"], "{q:?}");
    }
    let users = [
        ("01", "r"),
        ("x", "r"),
        ("-3", "r"),
        ("18446744073709551616", "r"),
    ];
    for (user, rid) in users
        .into_iter()
        .chain([("7", ""), ("7", "a b"), ("7", "é")])
    {
        let cmd = purchase_call(&keys, sku, &["1", user, rid, "1"]);
        let out: Vec<String> = cmd.query_async(&mut conn).await.expect("answered");
        assert_eq!(out[4..], ["INVALID_REQUEST"], "user {user:?} rid {rid:?}");
    }
    let cmd = purchase_call(&keys, sku, &["1", "7", "r1", "99999999999999999999"]);
    let out: Vec<String> = cmd.query_async(&mut conn).await.expect("answered");
    assert_eq!(out[4..], ["LIMIT_EXCEEDED"], "an integer above the limit");
    before.unchanged(&mut conn, &keys, sku).await;
}

#[tokio::test]
async fn malformed_calls_are_refused_before_any_write() {
    let (before, keys, sku, mut conn) = warmed(SaleMode::Direct, 5, 1).await;
    let bad_batches: [&[&str]; 6] = [
        &[],
        &["0"],
        &["x", "7", "r", "1"],
        &["2", "7", "r", "1"],
        &["1", "7", "r"],
        &["1025"],
    ];
    for argv in bad_batches {
        let r: RedisResult<Value> = purchase_call(&keys, sku, argv).query_async(&mut conn).await;
        let err = r.expect_err("refused");
        assert_eq!(err.code(), Some("INVALID_ARGS"), "{argv:?}: {err}");
    }
    let own = format!("{sku}-1-1");
    let other = [
        (
            scripts::RESOLVE,
            vec![keys.sale(sku)],
            vec!["1-1-1", "7", "paid"],
        ),
        (
            scripts::RESOLVE,
            resolve_keys(&keys, sku),
            vec!["1-1-1", "7", "expired"],
        ),
        (
            scripts::RESOLVE,
            resolve_keys(&keys, sku),
            vec!["1-1-1", "7"],
        ),
        (scripts::EXPIRE_DUE, resolve_keys(&keys, sku), vec!["0"]),
        (scripts::SET_STATE, vec![keys.sale(sku)], vec!["bogus"]),
        (
            scripts::RESOLVE,
            resolve_keys(&keys, sku),
            vec!["not-an-order", "7", "cancelled"],
        ),
        (
            scripts::RESTORE_ORDERS,
            restore_keys(&keys, sku),
            vec!["1", "1-1-1", "7", "r", "1", "CREATED", "0", "0"],
        ),
        (
            scripts::RESTORE_ORDERS,
            restore_keys(&keys, sku),
            vec!["1", &own, "7", "r", "1", "SOLD", "0", "0"],
        ),
    ];
    for (src, k, argv) in other {
        let r: RedisResult<Value> = Script::new(src)
            .key(k)
            .arg(argv)
            .invoke_async(&mut conn)
            .await;
        assert_eq!(r.expect_err("refused").code(), Some("INVALID_ARGS"));
    }
    before.unchanged(&mut conn, &keys, sku).await;
}

fn restore_keys(keys: &Keys, sku: SkuId) -> Vec<String> {
    keys.copy_state(sku).to_vec()
}

fn resolve_keys(keys: &Keys, sku: SkuId) -> Vec<String> {
    vec![
        keys.sale(sku),
        keys.buyers(sku),
        keys.orders(sku),
        keys.holds(sku),
        keys.events(sku),
        keys.records(sku),
        keys.batches(sku),
    ]
}

#[tokio::test]
async fn load_validates_its_arguments_and_replaces_only_older_copies() {
    let t = TestLedger::new().await;
    let keys = t.ledger.keys().clone();
    let sku = SkuId(77);
    let mut conn = raw().await;
    let k = keys.copy_state(sku);
    let good = [
        "77", "10", "10", "0", "0", "0", "1", "1", "direct", "0", "0", "100", "live", "1",
    ];
    let script = Script::new(scripts::LOAD);
    let load = |argv: [&'static str; 14], mut conn: redis::aio::MultiplexedConnection| {
        let (script, k) = (&script, &k);
        async move { script.key(k).arg(&argv).invoke_async(&mut conn).await }
    };
    let bad_at = [
        (0, "78"),
        (2, "9"),
        (1, "0"),
        (6, "0"),
        (7, "0"),
        (8, "both"),
        (9, "x"),
        (11, "0"),
        (12, "open"),
        (11, "9007199254740993"),
        (13, "3"),
    ];
    for (i, value) in bad_at {
        let mut argv = good;
        argv[i] = value;
        let r: RedisResult<String> = load(argv, conn.clone()).await;
        assert_eq!(
            r.expect_err("refused").code(),
            Some("INVALID_ARGS"),
            "arg {i}"
        );
    }
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&k[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
    let ok: String = load(good, conn.clone()).await.unwrap();
    assert_eq!(ok, "OK");
    assert_eq!(stock(t.ledger.as_ref(), sku).await, (10, 0, 0, 0));
    let again: String = load(good, conn.clone()).await.unwrap();
    assert_eq!(again, "ALREADY_WARM", "a copy of the same epoch stands");
    let mut newer = good;
    newer[6] = "2";
    let ok: String = load(newer, conn.clone()).await.unwrap();
    assert_eq!(ok, "OK", "an older copy is replaced");
    t.cleanup().await;
}

#[tokio::test]
async fn snapshot_reads_counters_and_events_together() {
    let t = TestLedger::new().await;
    let l = t.ledger.as_ref();
    let sku = warm(l, &live_sale(SaleMode::Reserve, 5, 2)).await;
    let o = flashsale_testkit::conformance::buy_ok(l, sku, 1, "a", 2).await;
    l.pay(&o.order_no, o.user_id).await.unwrap().unwrap();
    let snap = t.ledger.snapshot(sku).await.unwrap().expect("warm");
    assert_eq!(snap.counters, l.counters(sku).await.unwrap().unwrap());
    assert_eq!(snap.epoch, 1);
    assert_eq!(snap.fields["mode"], "reserve");
    let events: Vec<_> = snap
        .events
        .into_iter()
        .filter_map(|(_, e)| e.unwrap().event().cloned())
        .collect();
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(events[0].order_no, o.order_no);
    assert_eq!(events[0].deadline_ms, o.deadline_ms);
    assert_eq!(
        (events[1].kind.as_str(), events[1].deadline_ms),
        ("paid", 0)
    );
    assert!(t.ledger.snapshot(SkuId(1)).await.unwrap().is_none());
    assert_eq!(t.ledger.sales().await.unwrap(), vec![sku]);
    t.cleanup().await;
}

/// The admission script refuses bad calls before any write: a wrong key count, an unknown
/// operation, a bad number, a join before a seed is committed; a seed once committed stays.
#[tokio::test]
async fn the_admission_script_validates_its_calls() {
    let (_before, keys, sku, mut conn) = warmed(SaleMode::Direct, 5, 1).await;
    let script = Script::new(scripts::ADMISSION);
    let call = |argv: Vec<&str>| {
        let mut inv = script.prepare_invoke();
        for k in keys.admission(sku) {
            inv.key(k);
        }
        inv.arg(argv);
        inv
    };
    let r: RedisResult<Value> = call(vec!["join_many", "0", "10", "7"])
        .invoke_async(&mut conn)
        .await;
    assert_eq!(r.expect_err("no seed").code(), Some("NO_SEED"));
    let seed = "ab".repeat(32);
    let s: String = call(vec!["commit_seed", &seed])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(s, seed);
    let other = "cd".repeat(32);
    let s: String = call(vec!["commit_seed", &other])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(s, seed, "the first seed stays");
    for argv in [
        vec!["commit_seed", "short"],
        vec!["bogus"],
        vec!["join_many", "0", "10", "-1"],
        vec!["join_many", "x", "10", "7"],
        vec!["enter", "7", "0", "0", "10", "10"],
        vec!["advance", "0", "1.5"],
    ] {
        let r: RedisResult<Value> = call(argv.clone()).invoke_async(&mut conn).await;
        assert_eq!(
            r.expect_err("refused").code(),
            Some("INVALID_ARGS"),
            "{argv:?}"
        );
    }
    let few: RedisResult<Value> = Script::new(scripts::ADMISSION)
        .key(keys.sale(sku))
        .arg("counts")
        .arg(0)
        .invoke_async(&mut conn)
        .await;
    assert_eq!(few.expect_err("one key").code(), Some("INVALID_ARGS"));
    let joins: i64 = redis::cmd("HLEN")
        .arg(&keys.admission(sku)[1])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(joins, 0, "nothing joined");
}
