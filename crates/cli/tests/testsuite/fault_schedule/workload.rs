//! The clients: seeded buyers over HTTP, round-robin over the two instances. Every answer is
//! recorded as it came (instance, sku, user, request_id, HTTP status, order_no, status), the
//! raw material of the checker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_core::buckets::home_bucket;
use flashsale_core::UserId;
use flashsale_server::auth::Auth;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::plan::Plan;
use super::procs::{ADMIN, SECRET};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Purchase,
    Pay,
    Cancel,
}

/// One request and its answer. `status` 0: no answer (refused connection, timeout).
#[derive(Debug, Clone)]
pub struct Answer {
    pub sent_ms: u64,
    pub at_ms: u64,
    pub instance: usize,
    pub op: Op,
    pub sku: u64,
    pub user: u64,
    /// The purchase's request id (for pay and cancel: the order's).
    pub request_id: String,
    pub quantity: u32,
    pub status: u16,
    /// The answered order number (for pay and cancel: the order acted on).
    pub order_no: Option<String>,
    pub order_status: Option<String>,
    pub code: Option<String>,
    /// The purchase answer's `replayed`: false when this answer accepted it first.
    pub replayed: Option<bool>,
}

impl Answer {
    /// The same purchase again (a retry).
    pub fn attempt(&self) -> Attempt {
        Attempt {
            sku: self.sku,
            user: self.user,
            request_id: self.request_id.clone(),
            quantity: self.quantity,
        }
    }

    /// A purchase the service accepted (a first answer or a replay).
    pub fn accepted(&self) -> bool {
        self.op == Op::Purchase && self.status == 202 && self.order_no.is_some()
    }

    /// No answer, or one that asks to come back later: a client retries it.
    pub fn retryable(&self) -> bool {
        self.status == 0 || self.status >= 500 || self.status == 429
    }
}

/// One purchase attempt; a retry sends the same again.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub sku: u64,
    pub user: u64,
    pub request_id: String,
    pub quantity: u32,
}

/// Sends requests to the instances as a user and turns each reply into an [`Answer`].
#[derive(Clone)]
pub struct Caller {
    pub bases: Vec<String>,
    pub http: reqwest::Client,
    pub auth: Arc<Auth>,
    /// Answers are timed in ms from here (the workload's start).
    pub start: Instant,
}

impl Caller {
    pub fn new(bases: Vec<String>, http: reqwest::Client, start: Instant) -> Caller {
        let auth = Arc::new(Auth::new(SECRET, ADMIN));
        Caller {
            bases,
            http,
            auth,
            start,
        }
    }

    pub async fn purchase(&self, instance: usize, a: &Attempt) -> Answer {
        let url = format!("{}/api/v1/sales/{}/purchases", self.bases[instance], a.sku);
        let body = json!({"request_id": a.request_id, "quantity": a.quantity});
        let sent_ms = self.now_ms();
        let (status, v) = self.post(&url, a.user, Some(body)).await;
        self.answer(sent_ms, instance, Op::Purchase, a, status, &v)
    }

    /// Pays or cancels the order `order` answered.
    pub async fn resolve(&self, instance: usize, order: &Answer, op: Op) -> Answer {
        let action = if op == Op::Pay { "pay" } else { "cancel" };
        let no = order.order_no.clone().unwrap_or_default();
        let url = format!("{}/api/v1/orders/{no}/{action}", self.bases[instance]);
        let sent_ms = self.now_ms();
        let (status, v) = self.post(&url, order.user, None).await;
        let mut answer = self.answer(sent_ms, instance, op, &order.attempt(), status, &v);
        answer.order_no = Some(no);
        answer
    }

    async fn post(&self, url: &str, user: u64, body: Option<Value>) -> (u16, Value) {
        let token = self.auth.sign(UserId(user), 600);
        let mut req = self.http.post(url).bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                (status, resp.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
    }

    fn answer(
        &self,
        sent_ms: u64,
        instance: usize,
        op: Op,
        a: &Attempt,
        status: u16,
        v: &Value,
    ) -> Answer {
        let text = |k: &str| v[k].as_str().map(str::to_owned);
        Answer {
            sent_ms,
            at_ms: self.now_ms(),
            instance,
            op,
            sku: a.sku,
            user: a.user,
            request_id: a.request_id.clone(),
            quantity: a.quantity,
            status,
            order_no: text("order_no"),
            order_status: text("status"),
            code: text("code"),
            replayed: v["replayed"].as_bool(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// Most operations one client issues: the stop flag ends the run long before.
const OPS_MAX: usize = 50_000;

/// Runs `plan.clients` clients until `stop` is set; returns every answer.
pub async fn run(plan: Arc<Plan>, caller: Caller, stop: Arc<AtomicBool>) -> Vec<Answer> {
    let tasks: Vec<_> = (0..plan.clients)
        .map(|id| {
            let seed = plan.seed.wrapping_mul(1_000).wrapping_add(id as u64);
            let mut client = Client {
                id,
                rng: StdRng::seed_from_u64(seed),
                plan: plan.clone(),
                caller: caller.clone(),
                turn: id,
                made: 0,
                answers: Vec::new(),
                to_retry: Vec::new(),
                reserved: Vec::new(),
            };
            let stop = stop.clone();
            tokio::spawn(async move {
                client.run(&stop).await;
                client.answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.expect("a client panicked"));
    }
    answers
}

struct Client {
    id: usize,
    rng: StdRng,
    plan: Arc<Plan>,
    caller: Caller,
    /// Round-robin position over the instances.
    turn: usize,
    /// Request ids made so far (they are `s<seed>c<client>n<k>`).
    made: usize,
    answers: Vec<Answer>,
    /// Purchases whose answer was an error or none: the client retries them, same id.
    to_retry: Vec<usize>,
    /// Accepted reserve-mode orders this client has not paid or cancelled yet.
    reserved: Vec<usize>,
}

impl Client {
    async fn run(&mut self, stop: &AtomicBool) {
        for _ in 0..OPS_MAX {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            self.step().await;
            // Load shaping, not synchronisation: keeps the sales selling while faults land.
            tokio::time::sleep(Duration::from_millis(self.plan.pace_ms)).await;
        }
    }

    /// One seeded operation: a retry, a repeat buyer, a payment or cancel, or a new buyer.
    async fn step(&mut self) {
        let roll = self.rng.random_range(0..100);
        if roll < 15 && !self.to_retry.is_empty() {
            let i = self.rng.random_range(0..self.to_retry.len());
            let again = self.answers[self.to_retry.swap_remove(i)].attempt();
            self.purchase(again).await;
        } else if roll < 25 && !self.answers.is_empty() {
            // Any earlier purchase again, same request id: a retry must get its first outcome.
            let again = self.pick(|a| a.op == Op::Purchase).attempt();
            self.purchase(again).await;
        } else if roll < 35 && self.answers.iter().any(Answer::accepted) {
            // A buyer who already bought tries again with a new request id.
            let (sku, user) = {
                let won = self.pick(Answer::accepted);
                (won.sku, won.user)
            };
            let attempt = self.new_attempt(sku, user);
            self.purchase(attempt).await;
        } else if roll < 55 && !self.reserved.is_empty() {
            self.resolve().await;
        } else {
            let sku = self.plan.sales[self.rng.random_range(0..self.plan.sales.len())].sku;
            let user = self.new_buyer(sku);
            let attempt = self.new_attempt(sku, user);
            self.purchase(attempt).await;
        }
    }

    /// A buyer among `1..=buyers`; for a skewed sale, one homed at its bucket the plan's
    /// share of the time (drawn again until one is, a few dozen tries at most).
    fn new_buyer(&mut self, sku: u64) -> u64 {
        let mut user = self.rng.random_range(1..=self.plan.buyers);
        let skew = self.plan.skew.filter(|s| s.sku == sku);
        let sale = self.plan.sales.iter().find(|s| s.sku == sku);
        let (Some(skew), Some(sale)) = (skew, sale) else {
            return user;
        };
        if self.rng.random_range(0..100) >= skew.percent {
            return user;
        }
        for _ in 0..64 {
            if home_bucket(UserId(user), sale.buckets) == skew.home {
                break;
            }
            user = self.rng.random_range(1..=self.plan.buyers);
        }
        user
    }

    /// A seeded pick among this client's answers that match (callers make sure one does).
    fn pick(&mut self, matches: impl Fn(&Answer) -> bool) -> Answer {
        let all: Vec<&Answer> = self.answers.iter().filter(|a| matches(a)).collect();
        all[self.rng.random_range(0..all.len())].clone()
    }

    /// A new purchase attempt: a fresh request id (`s<seed>c<client>n<k>`), 2 units now and
    /// then where the limit allows it.
    fn new_attempt(&mut self, sku: u64, user: u64) -> Attempt {
        self.made += 1;
        let sale = self.plan.sales.iter().find(|s| s.sku == sku);
        let limit = sale.map_or(1, |s| s.per_user_limit);
        let two = limit > 1 && self.rng.random_bool(0.25);
        Attempt {
            sku,
            user,
            request_id: format!("s{}c{}n{}", self.plan.seed, self.id, self.made),
            quantity: if two { 2 } else { 1 },
        }
    }

    fn next_instance(&mut self) -> usize {
        self.turn = (self.turn + 1) % self.caller.bases.len();
        self.turn
    }

    /// Sends a purchase (the same body on a retry) and records its answer.
    async fn purchase(&mut self, attempt: Attempt) {
        let instance = self.next_instance();
        let answer = self.caller.purchase(instance, &attempt).await;
        let idx = self.answers.len();
        let seen = |a: &Answer| a.accepted() && a.order_no == answer.order_no;
        let first_time = answer.accepted() && !self.answers.iter().any(seen);
        if answer.retryable() {
            self.to_retry.push(idx);
        }
        let sale = self.plan.sales.iter().find(|s| s.sku == attempt.sku);
        if first_time && sale.is_some_and(|s| s.payment_timeout_ms.is_some()) {
            self.reserved.push(idx);
        }
        self.answers.push(answer);
    }

    /// Pays (mostly) or cancels one of this client's reserved orders.
    async fn resolve(&mut self) {
        let pick = self.rng.random_range(0..self.reserved.len());
        let order = self.answers[self.reserved[pick]].clone();
        let op = if self.rng.random_bool(0.7) {
            Op::Pay
        } else {
            Op::Cancel
        };
        let instance = self.next_instance();
        let answer = self.caller.resolve(instance, &order, op).await;
        // An error or no answer: the order stays on the list, so the client may try again.
        if !answer.retryable() {
            self.reserved.swap_remove(pick);
        }
        self.answers.push(answer);
    }
}
