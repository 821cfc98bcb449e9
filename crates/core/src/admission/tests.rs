use super::pass::{self, PassError};
use super::*;
use crate::sale::SaleState;

fn queue_sale() -> Sale {
    Sale {
        admission: Admission {
            mode: AdmissionMode::Queue,
            admission_opens_at_ms: 500,
            draw_at_ms: 0,
        },
        starts_at_ms: 1_000,
        ends_at_ms: 10_000,
        state: SaleState::Scheduled,
        ..Sale::always_open(SkuId(7), 10)
    }
}

fn draw_sale() -> Sale {
    Sale {
        mode: SaleMode::Reserve,
        payment_timeout_ms: 60_000,
        admission: Admission {
            mode: AdmissionMode::Draw,
            admission_opens_at_ms: 100,
            draw_at_ms: 2_000,
        },
        ..queue_sale()
    }
}

#[test]
fn admission_validation_names_the_bad_field() {
    queue_sale().validate().unwrap();
    draw_sale().validate().unwrap();
    Sale::always_open(SkuId(1), 1).validate().unwrap();
    let with = |base: Sale, change: fn(&mut Sale)| {
        let mut s = base;
        change(&mut s);
        s
    };
    let cases = [
        (
            with(queue_sale(), |s| s.admission.admission_opens_at_ms = 1_000),
            "admission_opens_at_ms",
        ),
        (
            with(queue_sale(), |s| s.admission.draw_at_ms = 5),
            "draw_at_ms",
        ),
        (
            with(queue_sale(), |s| s.admission.admission_opens_at_ms = -1),
            "admission_opens_at_ms",
        ),
        (with(draw_sale(), |s| s.mode = SaleMode::Direct), "mode"),
        (
            with(draw_sale(), |s| s.admission.draw_at_ms = 900),
            "draw_at_ms",
        ),
        (
            with(draw_sale(), |s| s.admission.draw_at_ms = 10_000),
            "draw_at_ms",
        ),
        (
            with(draw_sale(), |s| s.admission.admission_opens_at_ms = 2_000),
            "admission_opens_at_ms",
        ),
        (
            with(Sale::always_open(SkuId(1), 1), |s| {
                s.admission.admission_opens_at_ms = 1
            }),
            "admission_opens_at_ms",
        ),
    ];
    for (bad, field) in cases {
        let err = bad.validate().unwrap_err();
        assert!(err.contains(field), "{field}: {err}");
    }
}

#[test]
fn a_sale_without_admission_fields_reads_as_open() {
    let json = serde_json::to_value(Sale::always_open(SkuId(3), 5)).unwrap();
    assert_eq!(json["admission"], "open");
    let mut old = json.clone();
    let obj = old.as_object_mut().unwrap();
    obj.remove("admission");
    obj.remove("admission_opens_at_ms");
    obj.remove("draw_at_ms");
    let back: Sale = serde_json::from_value(old).unwrap();
    assert_eq!(back.admission, Admission::default());
}

#[test]
fn the_commitment_is_the_seeds_sha256() {
    // SHA-256 of 32 zero bytes (a published test vector).
    assert_eq!(
        commitment(&[0u8; 32]),
        "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
    );
    let seed = [7u8; 32];
    assert_eq!(seed_from_hex(&hex(&seed)), Some(seed));
    assert_eq!(seed_from_hex("zz"), None);
}

#[test]
fn the_shuffle_is_a_permutation_fixed_by_the_seed() {
    let users: Vec<UserId> = (1..=1_000).map(UserId).collect();
    let a = shuffle(&[1u8; 32], &users);
    let b = shuffle(&[1u8; 32], &users);
    let c = shuffle(&[2u8; 32], &users);
    assert_eq!(a, b);
    assert_ne!(a, c);
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, users);
    assert_ne!(a, users, "join order is not kept");
}

#[test]
fn the_draw_fills_the_stock_in_waitlist_order() {
    let entries: Vec<Entry> = (1..=500)
        .map(|u| Entry {
            user_id: UserId(u),
            quantity: (u % 3 + 1) as u32,
        })
        .collect();
    let result = draw(&[9u8; 32], &entries, 100);
    assert_eq!(result.len(), entries.len());
    let won: u64 = result
        .iter()
        .filter(|(_, w)| *w)
        .map(|(e, _)| u64::from(e.quantity))
        .sum();
    assert_eq!(
        won, 100,
        "enough entries of one unit fill the stock exactly"
    );
    assert_eq!(result, draw(&[9u8; 32], &entries, 100));
    let by_rank: Vec<UserId> = result.iter().map(|(e, _)| e.user_id).collect();
    let users: Vec<UserId> = entries.iter().map(|e| e.user_id).collect();
    assert_eq!(by_rank, shuffle(&[9u8; 32], &users));
}

#[test]
fn a_wave_fills_the_window_and_never_moves_back() {
    assert_eq!(wave_window(10), 15);
    assert_eq!(wave_window(1), 2);
    assert_eq!(wave_window(0), 0);
    assert_eq!(next_cursor(0, 0, 10, 1_000, 100), 15);
    assert_eq!(next_cursor(15, 0, 10, 1_000, 100), 15, "window full");
    assert_eq!(next_cursor(15, 5, 10, 1_000, 100), 20, "five done");
    assert_eq!(next_cursor(0, 0, 1_000, 1_000_000, 100), 100, "wave_max");
    assert_eq!(next_cursor(0, 0, 10, 7, 100), 7, "never past the queue");
    assert_eq!(next_cursor(30, 0, 0, 100, 100), 30, "sold out: stays");
}

#[test]
fn a_pass_is_bound_to_user_sale_and_time() {
    let key = pass::key(b"secret");
    let (sku, user) = (SkuId(42), UserId(7));
    let text = pass::sign(&key, sku, user, 5_000);
    assert_eq!(pass::verify(&key, &text, sku, user, 4_999), Ok(5_000));
    assert_eq!(
        pass::verify(&key, &text, sku, user, 5_000),
        Err(PassError::Expired)
    );
    assert_eq!(
        pass::verify(&key, &text, SkuId(43), user, 0),
        Err(PassError::OtherSale)
    );
    assert_eq!(
        pass::verify(&key, &text, sku, UserId(8), 0),
        Err(PassError::OtherUser)
    );
    let other_key = pass::key(b"other");
    assert_eq!(
        pass::verify(&other_key, &text, sku, user, 0),
        Err(PassError::BadSignature)
    );
    let forged = text.replace(".5000.", ".9000.");
    assert_eq!(
        pass::verify(&key, &forged, sku, user, 0),
        Err(PassError::BadSignature)
    );
    for bad in ["", "v1", "v1.42.7.5000.zz", &"x".repeat(500)] {
        assert_eq!(
            pass::verify(&key, bad, sku, user, 0),
            Err(PassError::Malformed)
        );
    }
}

/// splitmix64: a seeded generator for the simulation (the domain crate has no `rand`).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Kendall's tau-a of two sequences and the two-sided p-value of the hypothesis of no
/// association (normal approximation, Var S = n(n−1)(2n+5)/18).
fn kendall(xs: &[i64], ys: &[i64]) -> (f64, f64) {
    let n = xs.len();
    let mut s: i64 = 0;
    for i in 0..n {
        for j in i + 1..n {
            s += (xs[i] - xs[j]).signum() * (ys[i] - ys[j]).signum();
        }
    }
    let nf = n as f64;
    let tau = s as f64 / (nf * (nf - 1.0) / 2.0);
    let z = s as f64 / (nf * (nf - 1.0) * (2.0 * nf + 5.0) / 18.0).sqrt();
    (tau, erfc(z.abs() / std::f64::consts::SQRT_2))
}

/// erfc by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7).
fn erfc(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    poly * (-x * x).exp()
}

/// 10,000 buyers join the pre-queue at random times in the hour before the start, each seen
/// by the service after a random client latency of 1–300 ms; user ids are handed out in
/// arrival order (the worst case: ids that follow join time). The admission order (the
/// seeded shuffle) has Kendall |tau| < 0.05 with join time; the statistic itself sees the
/// arrival order's perfect correlation.
#[test]
fn the_pre_queue_order_does_not_follow_join_time() {
    let mut rng = Mix(0x5EED_2026);
    let n = 10_000;
    let mut joins: Vec<(i64, i64)> = (0..n)
        .map(|_| {
            let join = rng.below(3_600_000) as i64;
            (join + 1 + rng.below(300) as i64, join)
        })
        .collect();
    joins.sort();
    let users: Vec<UserId> = (1..=n as u64).map(UserId).collect();
    let join_time = |u: UserId| joins[(u.0 - 1) as usize].1;
    let mut seed = [0u8; 32];
    for chunk in seed.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next().to_be_bytes());
    }
    let order = shuffle(&seed, &users);
    let ranks: Vec<i64> = (0..n as i64).collect();
    let times: Vec<i64> = order.iter().map(|&u| join_time(u)).collect();
    let (tau, p) = kendall(&ranks, &times);
    println!("pre-queue of {n}: Kendall tau {tau:.5}, two-sided p = {p:.3}");
    assert!(tau.abs() < 0.05, "tau {tau}");
    let arrival: Vec<i64> = users.iter().map(|&u| join_time(u)).collect();
    let (tau_fifo, _) = kendall(&ranks, &arrival);
    assert!(tau_fifo > 0.95, "first come first served: tau {tau_fifo}");
}
