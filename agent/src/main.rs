//! The binary's edge: parse flags, run one subcommand, map the outcome to an exit code
//! (0 ok, 1 failure, 2 usage).

use clap::Parser;
use nodelb_agent::check;
use nodelb_agent::cli::{Cli, Command};
use nodelb_agent::host::sysctl::Sysctls;
use nodelb_agent::oneshot::{self, OneShot};
use nodelb_core::plan::config::DEFAULT_TABLE_NAME;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // Help and version print to stdout and exit 0; usage errors exit 2.
        Err(e) => e.exit(),
    };
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nodelb-agent: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run(args) => {
            nodelb_agent::run::malloc::tune();
            nodelb_agent::run::logging::init(args.log_format);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(nodelb_agent::run::run(args.settings()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Render(args) => {
            let one = OneShot::load(&args)?;
            report_skipped(&one);
            let plan = one.plan();
            for w in &plan.warnings {
                eprintln!("warning: {w}");
            }
            for (key, outcome) in &plan.services {
                eprintln!("service {key}: {outcome}");
            }
            print!("{}", oneshot::render(&plan));
            Ok(ExitCode::SUCCESS)
        }
        Command::Apply(args) => {
            let one = OneShot::load(&args)?;
            report_skipped(&one);
            let sysctls = Sysctls::default();
            for f in one.families.iter() {
                match sysctls.forwarding(f) {
                    Ok(nodelb_agent::host::sysctl::Forwarding::Forwarding) => {}
                    Ok(state) => eprintln!("warning: {f} {state}; programming it anyway"),
                    Err(e) => eprintln!("warning: {e}"),
                }
            }
            let plan = one.plan();
            for w in &plan.warnings {
                eprintln!("warning: {w}");
            }
            let applied = oneshot::apply(plan, one.families, &one.config)?;
            println!("{applied}");
            Ok(ExitCode::SUCCESS)
        }
        Command::ClearStatus(args) => clear_status(args),
        Command::Cleanup(args) => cleanup(args),
        Command::Check(args) => {
            let findings = check::run(args.ipv4, args.ipv6, &Sysctls::default());
            for f in &findings {
                println!("{f}");
            }
            Ok(ExitCode::from(check::exit_code(&findings) as u8))
        }
    }
}

fn report_skipped(one: &OneShot) {
    for s in &one.objects.skipped {
        eprintln!("warning: skipped {s}");
    }
}

/// `clear-status`: once no leader is left, remove nodelb's Service status fields.
fn clear_status(args: nodelb_agent::cli::ClearStatusArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let done = rt.block_on(async {
        use nodelb_agent::kube::clear_status;
        let client = nodelb_agent::kube::client(args.kubeconfig.as_deref()).await?;
        let ns = &args.lease_namespace;
        if let Some(agents) = &args.stop_agents {
            clear_status::stop_agents(&client, ns, agents).await?;
        }
        clear_status::wait_for_quiet_lease(&client, ns, args.wait).await?;
        let done = clear_status::clear_all(client.clone()).await?;
        println!("{done}");
        if let Some(cleanup) = &args.wait_for_cleanup {
            clear_status::wait_for_daemonset_ready(&client, ns, cleanup, args.wait).await?;
        }
        anyhow::Ok(done)
    })?;
    Ok(if done.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `cleanup`: once the node's agent has stopped (if asked), delete nodelb's tables.
fn cleanup(args: nodelb_agent::cli::CleanupArgs) -> anyhow::Result<ExitCode> {
    if let Some(addr) = args.after_agent_stops {
        oneshot::wait_until_closed(addr, args.wait)?;
    }
    let deleted = oneshot::cleanup(DEFAULT_TABLE_NAME)?;
    if deleted.is_empty() {
        println!("no nodelb tables");
    }
    for t in deleted {
        println!("deleted table {t}");
    }
    Ok(ExitCode::SUCCESS)
}
