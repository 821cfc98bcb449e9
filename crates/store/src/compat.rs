//! Rolling upgrades of the schema: whether this binary may run against a database that a
//! newer binary migrated further (docs/DEPLOY.md, "Rolling upgrades").
//!
//! A binary's schema version is its highest migration. Migrations are expand-then-contract:
//! an expand migration leaves every older binary able to run; a contract migration raises
//! `schema_compat.min_binary_version` to the first schema version that no longer needs what
//! it removes. A binary behind the database starts, ignoring the migrations it does not
//! know (sqlx's `ignore_missing`), only when its version is at least that declaration;
//! otherwise it refuses with both versions named, before touching anything, instead of
//! failing in the middle of a request.

use flashsale_core::StoreError;
use sqlx::migrate::{Migrate, MigrateError, Migrator};

use crate::backend::{Backend, Columns};

/// The declaration's query (one row, written by the migrations).
pub(crate) const MIN_BINARY_SQL: &str = "SELECT min_binary_version FROM schema_compat WHERE id = 1";

/// This binary's schema version: the highest migration it embeds.
pub(crate) fn binary_version(migrator: &Migrator) -> i64 {
    migrator.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Whether to migrate with the database's newer migrations ignored: false when the database
/// is not ahead of `binary`; true when it is and declares `binary` compatible; an error that
/// names both versions when it does not (or declares nothing).
pub(crate) fn ignore_newer(
    binary: i64,
    database: Option<i64>,
    min_binary: Option<i64>,
) -> Result<bool, StoreError> {
    let Some(database) = database.filter(|&d| d > binary) else {
        return Ok(false);
    };
    match min_binary {
        Some(min) if min <= binary => Ok(true),
        declared => Err(StoreError::Internal(format!(
            "the database is at schema version {database}, which needs {}; this binary's \
             schema version {binary} cannot run against it: deploy a binary of that schema \
             version or newer (see Rolling upgrades in docs/DEPLOY.md)",
            declared.map_or_else(
                || "a binary that knows it (it declares no compatible version)".to_owned(),
                |min| format!("{min} or newer")
            ),
        ))),
    }
}

/// The highest migration applied to the database behind `conn` (creating sqlx's table when
/// missing, as the migrator would).
pub(crate) async fn database_version<C: Migrate + ?Sized>(
    conn: &mut C,
) -> Result<Option<i64>, StoreError> {
    conn.ensure_migrations_table()
        .await
        .map_err(migrate_error)?;
    let applied = conn
        .list_applied_migrations()
        .await
        .map_err(migrate_error)?;
    Ok(applied.iter().map(|m| m.version).max())
}

/// `migrator` told whether to ignore the newer migrations, logged when it does.
pub(crate) fn prepare(
    mut migrator: Migrator,
    binary: i64,
    database: Option<i64>,
    min_binary: Option<i64>,
) -> Result<Migrator, StoreError> {
    let ignore = ignore_newer(binary, database, min_binary)?;
    if ignore {
        tracing::warn!(
            database,
            binary,
            min_binary,
            "running against a newer schema that declares this binary compatible (a rolling \
             upgrade or a rollback under way)"
        );
    }
    migrator.set_ignore_missing(ignore);
    Ok(migrator)
}

/// Runs `B`'s `migrator` (its `migrations/<backend>`) on `conn`, a connection the caller
/// holds (under its lock, or the single writer's), past a newer schema only when it declares
/// this binary compatible.
pub(crate) async fn run_migrations<B: Backend>(
    conn: &mut B::Connection,
    migrator: Migrator,
) -> Result<(), StoreError>
where
    B::Connection: Migrate,
{
    let binary = binary_version(&migrator);
    let database = database_version(conn).await?;
    let min_binary = match database {
        Some(d) if d > binary => match B::fetch(conn, MIN_BINARY_SQL, &[]).await?.first() {
            Some(row) => Some(row.int("min_binary_version")?),
            None => None,
        },
        _ => None,
    };
    let migrator = prepare(migrator, binary, database, min_binary)?;
    migrator.run_direct(conn).await.map_err(migrate_error)
}

/// A migration error as a store error.
pub(crate) fn migrate_error(e: MigrateError) -> StoreError {
    match e {
        MigrateError::Execute(e) => crate::rows::db_error(e),
        e => StoreError::Internal(format!("migration: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_schema_runs_only_when_declared_compatible() {
        assert!(!ignore_newer(6, None, None).unwrap());
        assert!(!ignore_newer(6, Some(6), Some(6)).unwrap());
        assert!(!ignore_newer(6, Some(4), None).unwrap());
        assert!(ignore_newer(6, Some(8), Some(6)).unwrap());
        assert!(ignore_newer(6, Some(7), Some(5)).unwrap());
        let refused = ignore_newer(6, Some(8), Some(7)).unwrap_err().to_string();
        assert!(
            refused.contains("schema version 8, which needs 7 or newer"),
            "{refused}"
        );
        assert!(
            refused.contains("this binary's schema version 6"),
            "{refused}"
        );
        let undeclared = ignore_newer(6, Some(7), None).unwrap_err().to_string();
        assert!(
            undeclared.contains("declares no compatible version"),
            "{undeclared}"
        );
    }
}
