//! What a database backend gives the one store algorithm ([`crate::store::Store`]), in the
//! manner of sqlx's `Migrate` trait and `Migrator::run_direct<C: Migrate>`: the algorithm is
//! written once over [`Backend`], and a backend holds only its SQL dialect, how it binds a
//! value ([`Arg`]) and reads a column ([`Columns`]) with its own column types, its
//! migrations, and the few steps that truly differ (how a transaction begins, how an insert
//! reports its id).
//!
//! Values are bound through [`Arg`], which names what a value is (an id, a count, a text),
//! never a SQL type: MySQL binds an id as `BIGINT UNSIGNED`, SQLite bit for bit as its
//! signed integer, PostgreSQL as `BIGINT` after checking it fits. Generic sqlx code over
//! `Database` would need the same knowledge in every bound, and sqlx's `Any` driver has no
//! unsigned integers at all.

use std::future::Future;
use std::pin::Pin;

use crate::sql::Dialect;
use flashsale_core::StoreError;

/// A boxed future, as a backend's steps return them (`Send`: the store is shared).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One value for one placeholder, named by what it holds.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// An id, a sequence number, an epoch or a duration: `u64` in the domain.
    Id(u64),
    OptId(Option<u64>),
    /// A time in ms or a signed count.
    Int(i64),
    /// A quantity, a limit or a count of attempts: `u32` in the domain.
    Small(u32),
    Flag(bool),
    Text(&'a str),
    OptText(Option<&'a str>),
}

/// One column of a row as a backend decodes it: rows are mapped to domain types once, in
/// `rows`, through this. MySQL reads its BINARY-flagged text unchecked and has unsigned
/// integers; SQLite keeps every integer as `i64` (a `u64` bit for bit); PostgreSQL has
/// signed `BIGINT`s that must not be negative. A derived `sqlx::FromRow` fits none of these.
pub trait Columns {
    fn text(&self, col: &str) -> Result<String, StoreError>;
    fn uint(&self, col: &str) -> Result<u64, StoreError>;
    fn opt_uint(&self, col: &str) -> Result<Option<u64>, StoreError>;
    fn int(&self, col: &str) -> Result<i64, StoreError>;
    fn small(&self, col: &str) -> Result<u32, StoreError>;
    fn flag(&self, col: &str) -> Result<bool, StoreError>;
}

/// A database the store runs on. Implemented by sqlx's `MySql`, `Sqlite` and `Postgres`.
pub trait Backend: sqlx::Database {
    /// The store's name in logs and `Debug`.
    const STORE: &'static str;
    /// Its SQL where the dialects differ.
    const DIALECT: &'static Dialect;
    /// What begins a write transaction (`None`: the driver's `BEGIN`).
    const BEGIN_WRITE: Option<&'static str> = None;
    /// The statements that leave a write connection's commits unsynced (written to the
    /// operating system, not yet forced to the disk) and that sync them again; `None` where
    /// the database has no such setting of its own per connection.
    const UNSYNCED: Option<(&'static str, &'static str)> = None;
    /// What begins a read transaction that sees one snapshot (`None`: the driver's `BEGIN`).
    const BEGIN_SNAPSHOT: Option<&'static str> = None;
    /// Whether `apply_events` first tries the short way for a spike's batch (a row-locking
    /// database with many writers; SQLite's embedded ledger has a writer of its own).
    const SHORT_WAY: bool = true;

    /// A row of a result.
    type Record: Columns + Send;

    /// Runs a statement; answers the rows it matched.
    fn run<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Runs a query; answers its rows.
    fn fetch<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> BoxFuture<'a, Result<Vec<Self::Record>, StoreError>>;

    /// Runs an insert (with the dialect's `returning_id` appended); answers the new row's id.
    fn insert_id<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        args: &'a [Arg<'a>],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let rows = Self::fetch(conn, sql, args).await?;
            match rows.first() {
                Some(row) => row.uint("id"),
                None => Err(StoreError::Internal("an insert returned no id".into())),
            }
        })
    }
}

/// A database server that many instances share (MySQL, PostgreSQL), as opposed to SQLite's
/// file of one process: `Store::connect` opens a pool to it by URL and migrates it under the
/// database's own lock, so instances that start together migrate it once between them.
pub trait Server: Backend {
    /// Takes the migration lock on `conn` (waiting a bounded time), runs
    /// `compat::run_migrations` and releases the lock.
    fn migrate_locked(conn: &mut Self::Connection) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// The `run` and `fetch` of a backend over sqlx: `$bind` binds one [`Arg`] to a query,
/// `$text` turns the crate's `?` text into the backend's.
macro_rules! sqlx_steps {
    ($bind:path, $text:path) => {
        fn run<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a str,
            args: &'a [$crate::backend::Arg<'a>],
        ) -> $crate::backend::BoxFuture<'a, Result<u64, flashsale_core::StoreError>> {
            Box::pin(async move {
                let sql = $text(sql);
                let mut q = sqlx::query(&sql);
                for a in args {
                    q = $bind(q, a)?;
                }
                let done = q.execute(conn).await.map_err($crate::rows::db_error)?;
                Ok(done.rows_affected())
            })
        }

        fn fetch<'a>(
            conn: &'a mut Self::Connection,
            sql: &'a str,
            args: &'a [$crate::backend::Arg<'a>],
        ) -> $crate::backend::BoxFuture<'a, Result<Vec<Self::Record>, flashsale_core::StoreError>> {
            Box::pin(async move {
                let sql = $text(sql);
                let mut q = sqlx::query(&sql);
                for a in args {
                    q = $bind(q, a)?;
                }
                q.fetch_all(conn).await.map_err($crate::rows::db_error)
            })
        }
    };
}
pub(crate) use sqlx_steps;

/// The backend's `bind`: one [`Arg`] as its driver takes it. Backends differ only in how an
/// id (`u64`) and a small count (`u32`) are bound: `id` maps one (and may refuse it), `small`
/// widens the other.
macro_rules! bind_args {
    ($q:lifetime, $db:ty, $args:ty, id: $id:expr, small: $small:expr) => {
        fn bind<$q>(
            q: sqlx::query::Query<$q, $db, $args>,
            a: &$q $crate::backend::Arg<$q>,
        ) -> Result<sqlx::query::Query<$q, $db, $args>, flashsale_core::StoreError> {
            use $crate::backend::Arg;
            Ok(match *a {
                Arg::Id(v) => q.bind($id(v)?),
                Arg::OptId(v) => q.bind(v.map($id).transpose()?),
                Arg::Int(v) => q.bind(v),
                Arg::Small(v) => q.bind($small(v)),
                Arg::Flag(v) => q.bind(v),
                Arg::Text(v) => q.bind(v),
                Arg::OptText(v) => q.bind(v),
            })
        }
    };
}
pub(crate) use bind_args;

/// `Columns` methods that decode a column straight into the domain's type (`name: type`).
macro_rules! decoded_columns {
    ($($name:ident: $t:ty),* $(,)?) => {$(
        fn $name(&self, col: &str) -> Result<$t, flashsale_core::StoreError> {
            sqlx::Row::try_get(self, col).map_err($crate::rows::db_error)
        }
    )*};
}
pub(crate) use decoded_columns;

/// The crate's `?` text as it is (MySQL, SQLite).
pub(crate) fn as_is(sql: &str) -> std::borrow::Cow<'_, str> {
    std::borrow::Cow::Borrowed(sql)
}

/// An id too large for a signed 64-bit column (SQLite's are bit for bit, PostgreSQL's
/// must fit).
pub(crate) fn signed(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Internal(format!("value out of range: {v}")))
}

/// A signed column read back as an id or count: never negative.
pub(crate) fn unsigned(col: &str, v: i64) -> Result<u64, StoreError> {
    u64::try_from(v)
        .map_err(|_| StoreError::Internal(format!("negative {col} in the database: {v}")))
}
