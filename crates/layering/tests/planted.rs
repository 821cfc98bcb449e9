//! The check fails on a planted arrow of each kind, and passes on the workspace as it is.

use flashsale_layering::{check_crates, check_route, check_server_part, graph, module_of};

fn scan(source: &str, file: &str) -> (Vec<String>, graph::Scanned) {
    let module = module_of(std::path::Path::new(file));
    let scanned = graph::scan(source, &module).expect("parses");
    (module, scanned)
}

#[test]
fn a_part_that_imports_a_reader_of_the_state_is_found() {
    let source = "use crate::routes::purchases;\nfn f() {}\n";
    let (module, scanned) = scan(source, "gateway/limits.rs");
    let found = check_server_part("gateway/limits.rs", &module, &scanned);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].line, 1);
}

#[test]
fn a_part_reaching_the_state_through_super_is_found() {
    let source = "fn f(s: &super::super::state::AppState) {}\n";
    let (module, scanned) = scan(source, "gateway/inner/x.rs");
    assert!(!check_server_part("gateway/inner/x.rs", &module, &scanned).is_empty());
}

#[test]
fn a_part_naming_only_parts_passes() {
    let source = "use crate::auth::Auth;\nuse flashsale_core::SkuId;\nfn f(_: Auth, _: SkuId) {}\n";
    let (module, scanned) = scan(source, "gateway/limits.rs");
    assert!(check_server_part("gateway/limits.rs", &module, &scanned).is_empty());
}

#[test]
fn a_handler_that_drives_an_engine_part_is_found() {
    let source = "async fn h(State(st): State<AppState>) { st.ledger.counters(1).await; st.auth.check(); }\n";
    let (module, scanned) = scan(source, "routes/planted.rs");
    let found = check_route("crates/server/src/routes/planted.rs", &module, &scanned);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].what.contains("ledger"));
}

#[test]
fn a_handler_that_imports_an_engine_module_is_found_and_the_use_cases_pass() {
    let source = "use flashsale_engine::breaker::Breaker;\nuse flashsale_engine::shop::Shop;\n";
    let (module, scanned) = scan(source, "routes/planted.rs");
    let found = check_route("crates/server/src/routes/planted.rs", &module, &scanned);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].what.contains("breaker"));
}

#[test]
fn a_handler_reaching_a_part_through_the_shop_or_a_destructured_call_is_found() {
    let source = "async fn a(call: UserOn<u64>) { let (st, user, p) = call.into_parts(); st.shop.ledger().counters(1).await; st.shop.pay(p, user).await; }\n\
                  async fn b(AdminOn { st, p, .. }: AdminOn<u64>) { st.sold_out.clear(p); }\n";
    let (module, scanned) = scan(source, "routes/planted.rs");
    let found = check_route("crates/server/src/routes/planted.rs", &module, &scanned);
    let what: Vec<&str> = found.iter().map(|f| f.what.as_str()).collect();
    assert_eq!(found.len(), 2, "{what:?}");
    assert!(
        what[0].contains("ledger") && what[1].contains("sold_out"),
        "{what:?}"
    );
}

#[test]
fn a_handler_asking_the_shop_for_use_cases_passes() {
    let source = "use flashsale_engine::shop::{Purchased, ShopError};\n\
                  async fn h(State(st): State<AppState>) { st.shop.purchase(1).await; st.gateway.blacklist.store.get(); }\n";
    let (module, scanned) = scan(source, "routes/planted.rs");
    let found = check_route("crates/server/src/routes/planted.rs", &module, &scanned);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_crate_that_depends_upward_is_found() {
    let metadata = serde_json::json!({"packages": [
        {"name": "flashsale-core", "manifest_path": "crates/core/Cargo.toml",
         "dependencies": [{"name": "flashsale-engine", "kind": null}]},
        {"name": "flashsale-engine", "manifest_path": "crates/engine/Cargo.toml",
         "dependencies": [{"name": "flashsale-core", "kind": null}, {"name": "flashsale-testkit", "kind": "dev"}]},
        {"name": "flashsale-testkit", "manifest_path": "crates/testkit/Cargo.toml", "dependencies": []},
    ]});
    let found = check_crates(&metadata);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0]
        .what
        .contains("flashsale-core may not have the dependency flashsale-engine"));
}

#[test]
fn the_workspace_as_it_is_passes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let report = flashsale_layering::check_workspace(&root).expect("the check runs");
    let lines: Vec<String> = report.findings.iter().map(ToString::to_string).collect();
    assert!(lines.is_empty(), "{}", lines.join("\n"));
}
