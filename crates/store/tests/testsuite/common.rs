//! What the modules share: the tests' clock, a sale and a request as the bodies build them, and
//! a store of each backend on a database (or file) of its own.

use flashsale_core::{PurchaseRequest, RequestId, Sale, SaleMode, SaleState, SkuId, UserId};
use flashsale_store::{MySqlStore, PgStore, SqliteStore};
use flashsale_testkit::{mariadb, postgres};

/// The tests' "now": every sale is open from 0 to twice this.
pub const NOW: i64 = 1_700_000_000_000;

/// A scheduled sale of one bucket, open from 0 to twice [`NOW`], a minute to pay.
pub fn sale(sku: SkuId, total_stock: u64, per_user_limit: u32, mode: SaleMode) -> Sale {
    Sale {
        sku_id: sku,
        name: "test".into(),
        total_stock,
        per_user_limit,
        mode,
        payment_timeout_ms: 60_000,
        starts_at_ms: 0,
        ends_at_ms: NOW * 2,
        state: SaleState::Scheduled,
        buckets: 1,
        admission: Default::default(),
    }
}

/// [`sale`], live.
pub fn live_sale(sku: SkuId, total_stock: u64, per_user_limit: u32, mode: SaleMode) -> Sale {
    Sale {
        state: SaleState::Live,
        ..sale(sku, total_stock, per_user_limit, mode)
    }
}

/// User `user`'s request `rid` for `quantity` units of `sku`.
pub fn request(sku: SkuId, user: u64, rid: &str, quantity: u32) -> PurchaseRequest {
    PurchaseRequest {
        sku_id: sku,
        user_id: UserId(user),
        request_id: RequestId::parse(rid).unwrap(),
        quantity,
    }
}

/// A MariaDB store over a database of its own, dropped with the guard.
pub async fn mysql() -> (mariadb::TestDatabase, MySqlStore) {
    let db = mariadb::TestDatabase::create().await;
    let store = MySqlStore::connect(&db.url).await.expect("connect");
    (db, store)
}

/// A PostgreSQL store over a database of its own, dropped with the guard.
pub async fn postgres() -> (postgres::TestDatabase, PgStore) {
    let db = postgres::TestDatabase::create().await;
    let store = PgStore::connect(&db.url).await.expect("connect");
    (db, store)
}

/// A SQLite store in the file `file` under a temp dir of its own (the store makes the folders
/// the path names), removed with the dir.
pub async fn sqlite(file: &str) -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(file);
    let store = SqliteStore::open(path.to_str().unwrap())
        .await
        .expect("open");
    (dir, store)
}
