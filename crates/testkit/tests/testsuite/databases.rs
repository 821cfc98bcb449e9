//! A test database exists while its guard lives and is gone once the guard drops, on MariaDB
//! and on PostgreSQL; throwaway MariaDB servers bootstrapped at once all start.

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

/// Throwaway MariaDB servers bootstrapped at the same moment all start and answer: each has
/// its own temporary directory (with a shared one, two bootstraps at once collided on their
/// temporary tables and one failed).
#[test]
fn throwaway_mariadb_servers_bootstrapped_at_once_all_answer() {
    const SERVERS: usize = 8;
    let threads: Vec<_> = (0..SERVERS)
        .map(|_| {
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                rt.block_on(async {
                    let server = mariadb::MariaDbServer::spawn().await;
                    let mut conn = MySqlConnection::connect(&server.url()).await;
                    let one = sqlx::query_scalar::<_, i64>("SELECT 1")
                        .fetch_one(conn.as_mut().expect("connect"))
                        .await;
                    one.expect("an answer")
                })
            })
        })
        .collect();
    // Every thread joined before any verdict, so that a failure leaves no server running.
    let answers: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
    for answer in answers {
        assert_eq!(answer.expect("a server started"), 1);
    }
}
