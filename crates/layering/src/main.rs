//! `flashsale-layering`: runs the layering check on the workspace this crate sits in and exits
//! 1 naming each arrow that breaks a rule.

fn main() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let report = flashsale_layering::check_workspace(&root)?;
    for f in &report.findings {
        eprintln!("layering: {f}");
    }
    if !report.findings.is_empty() {
        std::process::exit(1);
    }
    println!("layering: ok");
    Ok(())
}
