//! `loadtest`: many real clients against an idlegate gateway (or an MQTT broker), checking
//! every expiry against the guarantee and measuring the server. See `loadtest --help` and the
//! docs/BENCHMARKS.md, Running the load tests.

mod args;
mod backend;
mod client;
mod door;
mod fleet;
mod gateway;
mod merge;
mod nemesis;
mod payload;
mod plot;
#[allow(dead_code)] // hold_replies and switch serve the gateway's own tests (tests/common)
mod proxy;
mod report;
mod run;
mod shared;
mod stats;
mod tokens;
mod verdict;
mod watch;
mod wire;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::args::Args;
use crate::run::SetupError;

/// Exit status of a run interrupted with Ctrl-C, as shells report SIGINT.
const INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    // `loadtest verdict ...`: judge a recorded event stream (verdict.rs).
    if std::env::args().nth(1).as_deref() == Some("verdict") {
        return verdict_main();
    }
    // `loadtest watch ...`: what watch lists cost one gateway (watch.rs).
    if std::env::args().nth(1).as_deref() == Some("watch") {
        return watch_main();
    }
    // `loadtest nemesis ...`: a churning cluster under seeded faults (nemesis/).
    if std::env::args().nth(1).as_deref() == Some("nemesis") {
        return nemesis_main();
    }
    let args = Args::parse();
    if let Err(message) = args.validate() {
        Args::command().error(clap::error::ErrorKind::ValueValidation, message).exit();
    }
    if !args.merge.is_empty() {
        return match merge::merge(&args.merge) {
            Ok(report) => finish(&args, report),
            Err(message) => {
                eprintln!("loadtest: {message}");
                ExitCode::from(2)
            }
        };
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadtest: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("interrupted: closing clients and printing the summary so far");
    };
    let report = match runtime.block_on(run::run(&args, interrupt)) {
        Ok(report) => report,
        Err(SetupError::Usage(message)) => {
            eprintln!("loadtest: {message}");
            return ExitCode::from(2);
        }
        Err(SetupError::Unreachable(message)) => {
            eprintln!("loadtest: {message}");
            return ExitCode::FAILURE;
        }
    };
    finish(&args, report)
}

/// Prints the summary, writes the report and the plot, and gives the exit status.
fn finish(args: &Args, report: report::Report) -> ExitCode {
    print!("{}", report.summary());
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&report).expect("the report serializes");
        if let Err(e) = std::fs::write(path, json + "\n") {
            eprintln!("loadtest: --report {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.plot {
        if let Err(e) = plot::write(path, &report) {
            eprintln!("loadtest: --plot {e}");
            return ExitCode::FAILURE;
        }
    }
    if report.interrupted {
        return ExitCode::from(INTERRUPTED);
    }
    if let Some(fatal) = &report.fatal {
        eprintln!("loadtest: {fatal}");
        return ExitCode::FAILURE;
    }
    if args.check && !report.failures.is_empty() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `loadtest verdict`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "loadtest verdict",
    about = "Checks a recorded idlegate event stream against its promises (exit 0: none broken)"
)]
struct VerdictCli {
    #[command(flatten)]
    args: verdict::VerdictArgs,
}

fn verdict_main() -> ExitCode {
    let cli = VerdictCli::parse_from(std::env::args().skip(1));
    judged("verdict", verdict::run(&cli.args))
}

/// The exit status of a judged run: 0 clean, 1 violations, 2 (after saying why) when it
/// could not be judged.
fn judged(command: &str, verdict: Result<bool, String>) -> ExitCode {
    match verdict {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(message) => {
            eprintln!("loadtest {command}: {message}");
            ExitCode::from(2)
        }
    }
}

fn watch_main() -> ExitCode {
    let args = watch::WatchArgs::parse_from(std::env::args().skip(1));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadtest watch: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(watch::run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("loadtest watch: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `loadtest nemesis`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "loadtest nemesis",
    about = "Runs an idlegate cluster under a seeded random schedule of faults and checks every event promise (exit 0: none broken)"
)]
struct NemesisCli {
    #[command(flatten)]
    args: nemesis::NemesisArgs,
}

fn nemesis_main() -> ExitCode {
    let cli = NemesisCli::parse_from(std::env::args().skip(1));
    // A Redis Cluster's partition and delay redirect each gateway's connections with
    // iptables, in a network namespace of the run's own, taken before any thread starts.
    if cli.args.redis_cluster {
        if let Err(e) = nemesis::netcut::isolate() {
            eprintln!("loadtest nemesis: {e}");
            return ExitCode::from(2);
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadtest nemesis: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    judged("nemesis", runtime.block_on(nemesis::run(&cli.args)))
}
