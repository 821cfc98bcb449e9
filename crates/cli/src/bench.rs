//! `flashsale bench`: the binary's face of the measurements in `flashsale_bench::harness`.
//! Only `bench spike` reads the service's settings here (for its secrets and report folder).

use clap::{Args, Subcommand};
use flashsale_bench::harness::{self, spike};

use crate::settings::Settings;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    #[command(flatten)]
    Harness(Box<harness::BenchCommand>),
    /// A spike of buyers at running instances, with a report.
    Spike(Box<SpikeArgs>),
}

#[derive(Debug, Clone, Args)]
pub struct SpikeArgs {
    #[command(flatten)]
    pub spike: spike::SpikeArgs,
    #[command(flatten)]
    pub settings: Settings,
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Harness(cmd) => harness::run(*cmd).await,
        BenchCommand::Spike(args) => {
            let (jwt_secret, admin_token) = args.settings.secrets()?;
            let secrets = spike::SpikeSecrets {
                jwt_secret,
                admin_token,
                reports_dir: args.settings.data_dir.join("reports"),
            };
            spike::run(args.spike, secrets).await
        }
    }
}
