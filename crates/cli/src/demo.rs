//! `flashsale demo` (in progress).

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {}

pub async fn run(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("the demo is not built yet")
}
