//! [`PgStore`]: the system of record over PostgreSQL.
//!
//! The backend of [`Store`]: its dialect (`sql::postgres`, `$n` placeholders numbered from
//! the crate's `?` text), `BIGINT` columns for every integer (PostgreSQL has no unsigned
//! ones: an id or count above `i64::MAX` is refused when bound, a negative one when read),
//! `REPEATABLE READ` for the audit's one snapshot, and an advisory lock around migrations
//! ([`Server`]).
//! `apply_events` locks the sale row (`SELECT ... FOR UPDATE`), as on MySQL; under READ
//! COMMITTED a writer that waited for the lock reads the row, and every later statement,
//! as the previous writer committed them.

use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use sqlx::{Postgres, Row};

use flashsale_core::StoreError;

use crate::backend::{
    bind_args, decoded_columns, signed, sqlx_steps, unsigned, Backend, BoxFuture, Columns, Server,
};
use crate::rows::db_error;
use crate::sql::postgres::numbered;
use crate::sql::{self, Dialect};
use crate::store::Store;

/// The system of record on PostgreSQL.
pub type PgStore = Store<Postgres>;

/// How long an instance waits for another one's migrations.
const MIGRATE_LOCK_WAIT: &str = "60s";

bind_args!('q, Postgres, PgArguments, id: signed, small: i64::from);

impl Backend for Postgres {
    const STORE: &'static str = "PgStore";
    const DIALECT: &'static Dialect = &sql::postgres::DIALECT;
    // READ COMMITTED (the default) takes a snapshot per statement.
    const BEGIN_SNAPSHOT: Option<&'static str> =
        Some("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    type Record = PgRow;

    sqlx_steps!(bind, numbered);
}

/// An advisory lock of the database's, held around the compatibility check too (sqlx's own
/// lock covers only the migrations).
impl Server for Postgres {
    fn migrate_locked(conn: &mut PgConnection) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let lock = "hashtext('flashsale_migrate_' || current_database())";
            sqlx::query(&format!("SET lock_timeout = '{MIGRATE_LOCK_WAIT}'"))
                .execute(&mut *conn)
                .await
                .map_err(db_error)?;
            let locked = sqlx::query(&format!("SELECT pg_advisory_lock({lock})"))
                .execute(&mut *conn)
                .await;
            let _ = sqlx::query("RESET lock_timeout").execute(&mut *conn).await;
            if let Err(e) = locked {
                return Err(StoreError::Unavailable(format!(
                    "another instance held the migration lock for {MIGRATE_LOCK_WAIT}: {e}"
                )));
            }
            let ran = crate::compat::run_migrations::<Postgres>(
                conn,
                sqlx::migrate!("./migrations/postgres"),
            )
            .await;
            let unlock = format!("SELECT pg_advisory_unlock({lock})");
            let _ = sqlx::query(&unlock).execute(&mut *conn).await;
            ran
        })
    }
}

impl Columns for PgRow {
    decoded_columns!(text: String, int: i64, flag: bool);
    fn uint(&self, col: &str) -> Result<u64, StoreError> {
        unsigned(col, self.try_get(col).map_err(db_error)?)
    }
    fn opt_uint(&self, col: &str) -> Result<Option<u64>, StoreError> {
        let v: Option<i64> = self.try_get(col).map_err(db_error)?;
        v.map(|v| unsigned(col, v)).transpose()
    }
    fn small(&self, col: &str) -> Result<u32, StoreError> {
        let v: i64 = self.try_get(col).map_err(db_error)?;
        u32::try_from(v)
            .map_err(|_| StoreError::Internal(format!("{col} out of range in the database: {v}")))
    }
}
