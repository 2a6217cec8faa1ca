//! The command line: kops-like commands over the spec, the state store and (later) the cloud.

mod commands;
mod create;
mod edit;

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

pub use create::{CreateClusterArgs, build_cluster_objects};

use crate::output::Format;

/// Exit codes (documented in the README).
pub mod exit {
    pub const OK: i32 = 0;
    /// Any runtime failure: cloud, SSH, state store, I/O.
    pub const ERROR: i32 = 1;
    /// `update cluster --exit-code`: changes are pending.
    pub const CHANGES_PENDING: i32 = 2;
    /// The spec (file or flags) is invalid; nothing was written.
    pub const INVALID_SPEC: i32 = 3;
    /// Someone else changed the cluster or holds its lock; re-read and retry.
    pub const CONFLICT: i32 = 4;
    /// The command line itself is wrong.
    pub const USAGE: i32 = 64;
}

#[derive(Debug, Parser)]
#[command(
    name = "kprov",
    version,
    about = "Declarative Kubernetes clusters: kops's workflow, Kubespray's reach",
    propagate_version = true
)]
pub struct Cli {
    /// State store: file://DIR or s3://BUCKET/PREFIX [default: file://$HOME/.kprov/state]
    #[arg(long, global = true, env = "KPROV_STATE_STORE", value_name = "URL")]
    pub state: Option<String>,
    /// More output (-v: debug, -vv: trace)
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a cluster spec from flags, or objects from a file (writes the spec only)
    Create(CreateCmd),
    /// Replace stored objects with the ones in a file
    Replace(FileArgs),
    /// List clusters or instance groups
    Get(GetCmd),
    /// Edit a stored spec in $EDITOR; an invalid result is never saved
    Edit(EditCmd),
    /// Delete a cluster or an instance group
    Delete(DeleteCmd),
    /// Inspect or break a cluster's lock
    Lock(LockCmd),
    /// Export credentials (kubeconfig) of a provisioned cluster
    Export(ExportCmd),
    /// Print the JSON Schema of the kprov objects (for editors)
    Schema(SchemaArgs),
    /// Print a shell completion script
    Completion(CompletionArgs),
}

#[derive(Debug, Args)]
pub struct FileArgs {
    /// File with Cluster and InstanceGroup documents ('-' for standard input)
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CreateCmd {
    #[command(subcommand)]
    pub what: Option<CreateWhat>,
    /// Create the objects in FILE ('-' for standard input)
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum CreateWhat {
    /// Create a cluster spec (like `kops create cluster`): no infrastructure is changed
    Cluster(Box<CreateClusterArgs>),
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

#[derive(Debug, Args)]
pub struct GetCmd {
    #[command(subcommand)]
    pub what: GetWhat,
}

#[derive(Debug, Subcommand)]
pub enum GetWhat {
    /// List clusters, or show one
    #[command(visible_alias = "cluster")]
    Clusters {
        name: Option<String>,
        #[command(flatten)]
        out: OutputArgs,
        /// Show the completed spec (defaults filled in) instead of what was written
        #[arg(long)]
        full: bool,
    },
    /// List a cluster's instance groups
    #[command(visible_aliases = ["instancegroup", "ig", "igs"])]
    Instancegroups {
        /// The cluster (kops's --name is accepted too)
        #[arg(required_unless_present = "name")]
        cluster: Option<String>,
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        out: OutputArgs,
    },
}

#[derive(Debug, Args)]
pub struct EditCmd {
    #[command(subcommand)]
    pub what: EditWhat,
}

#[derive(Debug, Subcommand)]
pub enum EditWhat {
    /// Edit the Cluster object
    Cluster { name: String },
    /// Edit an InstanceGroup (`kprov edit ig --name CLUSTER GROUP`)
    #[command(visible_aliases = ["instancegroup", "ig"])]
    Instancegroups {
        group: String,
        /// The cluster
        #[arg(long)]
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct DeleteCmd {
    #[command(subcommand)]
    pub what: DeleteWhat,
}

#[derive(Debug, Subcommand)]
pub enum DeleteWhat {
    /// Delete a cluster (preview without --yes)
    Cluster {
        name: String,
        /// Really delete
        #[arg(long, short)]
        yes: bool,
    },
    /// Delete an instance group from the spec (preview without --yes)
    #[command(visible_aliases = ["instancegroup", "ig"])]
    Instancegroups {
        group: String,
        #[arg(long)]
        name: String,
        #[arg(long, short)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
pub struct LockCmd {
    #[command(subcommand)]
    pub what: LockWhat,
}

#[derive(Debug, Subcommand)]
pub enum LockWhat {
    /// Show who holds a cluster's lock
    Status { cluster: String },
    /// Remove a cluster's lock, whoever holds it (only when its holder is dead)
    Break { cluster: String },
}

#[derive(Debug, Args)]
pub struct ExportCmd {
    #[command(subcommand)]
    pub what: ExportWhat,
}

#[derive(Debug, Subcommand)]
pub enum ExportWhat {
    /// Merge the cluster's admin credentials into your kubeconfig (context named after the
    /// cluster; KUBECONFIG honoured like kubectl does)
    Kubeconfig {
        name: String,
        /// Write this file instead of $KUBECONFIG / ~/.kube/config
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SchemaKind {
    All,
    Cluster,
    Instancegroup,
}

#[derive(Debug, Args)]
pub struct SchemaArgs {
    #[arg(value_enum, default_value_t = SchemaKind::All)]
    pub kind: SchemaKind,
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    pub shell: clap_complete::Shell,
}

/// Parses arguments; usage errors exit with [`exit::USAGE`] (2 is reserved for "changes pending").
pub fn parse() -> Cli {
    match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => exit::OK,
                _ => exit::USAGE,
            };
            let _ = e.print();
            std::process::exit(code);
        }
    }
}

pub fn command() -> clap::Command {
    Cli::command()
}

pub use commands::run;
