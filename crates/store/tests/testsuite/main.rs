//! The store's integration tests, one binary (each former test file is a module): every
//! backend (MariaDB, PostgreSQL, SQLite) against the same bodies, the short apply path,
//! rolling schema upgrades and the order-event relay's rows.

/// Runs each named body (an async fn over a store) against MariaDB, PostgreSQL and SQLite, each
/// in a test of its own: a database of the test's own on the shared servers, a SQLite file in
/// a temp dir (under folders the store makes itself).
macro_rules! backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                let (_db, store) = crate::common::mysql().await;
                super::$name(&store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let (_db, store) = crate::common::postgres().await;
                super::$name(&store).await;
                store.close().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let (_dir, store) = crate::common::sqlite("nested/dir/flashsale.db").await;
                super::$name(&store).await;
            }

            /// The same bodies on databases contracted to one row per purchase.
            mod one_row {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn mysql() {
                    let (_db, store) = crate::common::mysql().await;
                    store.contract_one_row().await.expect("contract");
                    super::super::$name(&store).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    let (_db, store) = crate::common::postgres().await;
                    store.contract_one_row().await.expect("contract");
                    super::super::$name(&store).await;
                    store.close().await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    let (_dir, store) = crate::common::sqlite("flashsale.db").await;
                    store.contract_one_row().await.expect("contract");
                    super::super::$name(&store).await;
                }
            }
        }
    )*};
}

mod buckets;
mod common;
mod events;
mod one_row;
mod schema_compat;
mod short_apply;
mod store;
