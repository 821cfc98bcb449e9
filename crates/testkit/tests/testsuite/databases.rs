//! A test database exists while its guard lives and is gone once the guard drops, on MariaDB
//! and on PostgreSQL.

use flashsale_testkit::{mariadb, postgres};
use sqlx::{Connection, MySqlConnection, PgConnection};

/// The database's name: the last segment of its URL.
fn name_of(url: &str) -> String {
    url.rsplit('/')
        .next()
        .expect("a database in the URL")
        .to_owned()
}

/// Whether the shared MariaDB lists database `mysql`, and the shared PostgreSQL `pg`.
async fn listed(mysql: &str, pg: &str) -> (bool, bool) {
    let mut my = MySqlConnection::connect(&mariadb::shared_server_url()).await;
    let sql = "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?";
    let on_mysql = sqlx::query_scalar::<_, i64>(sql).bind(mysql);
    let on_mysql = on_mysql
        .fetch_one(my.as_mut().expect("connect to MariaDB"))
        .await;
    let admin = format!("{}/postgres", postgres::shared_server_url());
    let mut on = PgConnection::connect(&admin)
        .await
        .expect("connect to PostgreSQL");
    let sql = "SELECT COUNT(*) FROM pg_database WHERE datname = $1";
    let on_pg = sqlx::query_scalar::<_, i64>(sql)
        .bind(pg)
        .fetch_one(&mut on)
        .await;
    (on_mysql.expect("count") == 1, on_pg.expect("count") == 1)
}

#[tokio::test]
async fn a_test_database_lives_as_long_as_its_guard() {
    let mysql = mariadb::TestDatabase::create().await;
    let pg = postgres::TestDatabase::create().await;
    let names = (name_of(&mysql.url), name_of(&pg.url));
    assert_eq!(
        listed(&names.0, &names.1).await,
        (true, true),
        "{names:?} created"
    );
    drop((mysql, pg));
    assert_eq!(
        listed(&names.0, &names.1).await,
        (false, false),
        "{names:?} dropped"
    );
}
