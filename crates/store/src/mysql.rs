//! [`MySqlStore`]: the production system of record over MySQL / MariaDB.
//!
//! The backend of [`Store`]: its dialect (`sql::mysql`), unsigned integer binds, text read
//! unchecked (BINARY-flagged `ascii_bin` columns), `last_insert_id`, and a migration lock of
//! its own ([`Server`]). `apply_events` locks the sale row (`SELECT ... FOR UPDATE`), so concurrent
//! writers of one sale serialize on it; the guarded counter update is the last word either way.

use sqlx::mysql::{MySqlArguments, MySqlConnection, MySqlRow};
use sqlx::{MySql, Row};

use flashsale_core::StoreError;

use crate::backend::{
    as_is, bind_args, decoded_columns, sqlx_steps, Arg, Backend, BoxFuture, Columns, Server,
};
use crate::rows::db_error;
use crate::sql::{self, Dialect};
use crate::store::Store;

/// The system of record on MySQL / MariaDB.
pub type MySqlStore = Store<MySql>;

/// How long an instance waits for another one's migrations.
const MIGRATE_LOCK_WAIT_S: i64 = 60;

bind_args!('q, MySql, MySqlArguments, id: Ok::<u64, StoreError>, small: |v: u32| v);

impl Backend for MySql {
    const STORE: &'static str = "MySqlStore";
    const DIALECT: &'static Dialect = &sql::mysql::DIALECT;
    // InnoDB's REPEATABLE READ: one snapshot per transaction, so the driver's BEGIN will do.
    type Record = MySqlRow;

    sqlx_steps!(bind, as_is);

    fn insert_id<'a>(
        conn: &'a mut MySqlConnection,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut q = sqlx::query(sql);
            for a in args {
                q = bind(q, a)?;
            }
            let done = q.execute(conn).await.map_err(db_error)?;
            Ok(done.last_insert_id())
        })
    }
}

/// Instances that start together take turns under a named lock of the database's own:
/// sqlx's migration lock asks MariaDB for `GET_LOCK(name, -1)`, which MariaDB answers NULL
/// without locking, so two instances would both apply the first migration.
impl Server for MySql {
    fn migrate_locked(conn: &mut MySqlConnection) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let locked: Option<i64> = sqlx::query_scalar(
                "SELECT GET_LOCK(CONCAT('flashsale_migrate_', SHA1(DATABASE())), ?)",
            )
            .bind(MIGRATE_LOCK_WAIT_S)
            .fetch_one(&mut *conn)
            .await
            .map_err(db_error)?;
            if locked != Some(1) {
                return Err(StoreError::Unavailable(format!(
                    "another instance held the migration lock for {MIGRATE_LOCK_WAIT_S} s"
                )));
            }
            let ran =
                crate::compat::run_migrations::<MySql>(conn, sqlx::migrate!("./migrations/mysql"))
                    .await;
            let release = "SELECT RELEASE_LOCK(CONCAT('flashsale_migrate_', SHA1(DATABASE())))";
            let _ = sqlx::query(release).execute(&mut *conn).await;
            ran
        })
    }
}

/// Strings are read unchecked: `ascii_bin` columns carry the BINARY flag, which sqlx's
/// `String` refuses, though the bytes are ASCII text.
impl Columns for MySqlRow {
    fn text(&self, col: &str) -> Result<String, StoreError> {
        self.try_get_unchecked::<String, _>(col).map_err(db_error)
    }
    decoded_columns!(uint: u64, opt_uint: Option<u64>, int: i64, small: u32, flag: bool);
}
