//! Command implementations. Each returns an exit code; errors are mapped to exit codes in
//! [`run`].

use std::path::Path;

use anyhow::{Context, anyhow};

use super::create::{CreateClusterArgs, DryRunFormat};
use super::ctx::{Ctx, catch_interrupts, exit_code_of, interrupted};
use super::{
    BackupWhat, Cli, Command, CreateWhat, DeleteWhat, EditWhat, ExportWhat, ForgetWhat, GetWhat,
    LockWhat, ReleaseWhat, RestoreWhat, RollingUpdateWhat, RotateWhat, SchemaKind, UpdateWhat,
    ValidateWhat, exit,
};

use crate::ops::model::Target;
use crate::ops::objects::{self, Mode, Written, group_by_cluster};

use crate::ops::{damaged, locks};
use crate::output::{Format, Printer, untrusted};
use crate::spec;
use crate::views::create as view_create;
use crate::views::objects as view;

/// Carries out the parsed command and returns the process's exit code (see [`super::exit`]);
/// errors are printed here, never returned.
pub async fn run(cli: Cli) -> i32 {
    let format = match &cli.command {
        Command::Get(g) => match g {
            GetWhat::Clusters { out, .. }
            | GetWhat::Instancegroups { out, .. }
            | GetWhat::Certificates { out, .. }
            | GetWhat::Instances { out, .. }
            | GetWhat::Backups { out, .. }
            | GetWhat::Secrets { out, .. }
            | GetWhat::Assets { out, .. } => out.output,
            GetWhat::Addons { output, .. } => *output,
        },
        Command::Update(u) => match u {
            UpdateWhat::Cluster(a) => a.output,
            UpdateWhat::Addons(_) => Format::Table,
        },
        Command::Validate(ValidateWhat::Cluster { output, .. }) => *output,
        Command::Rotate(RotateWhat::Certificates(a)) => a.out.output,
        Command::RollingUpdate(RollingUpdateWhat::Cluster(a)) => a.output,
        Command::Delete(DeleteWhat::Instance(a)) => a.output,
        Command::Backup(BackupWhat::Etcd { out, .. }) => out.output,
        Command::Version(o) => o.output,
        Command::Toolbox(super::ToolboxWhat::Dump { output, .. }) => *output,
        _ => Format::Table,
    };
    let ctx = Ctx::new(
        Printer::new(format, cli.verbose),
        crate::ops::session::store_url(cli.state.as_deref()),
    );
    // A kops user's store setting is not kprov's: say which store is used instead of landing
    // clusters silently elsewhere.
    if cli.state.is_none()
        && let Ok(kops) = std::env::var("KOPS_STATE_STORE")
        && !kops.trim().is_empty()
    {
        ctx.printer.warn(&format!(
            "KOPS_STATE_STORE is set ({}) but kprov reads KPROV_STATE_STORE or --state: using {}",
            untrusted(&kops),
            ctx.store_url
        ));
    }
    match dispatch(&ctx, cli.command).await {
        Ok(code) => code,
        Err(e) => {
            let code = exit_code_of(&e);
            ctx.printer.error(&crate::output::error_chain(&e));
            code
        }
    }
}

async fn dispatch(ctx: &Ctx, cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Create(c) => match (c.what, c.file) {
            (Some(CreateWhat::Cluster(a)), _) => create_cluster(ctx, &a).await,
            (Some(CreateWhat::Bundle(a)), _) => super::bundle::create(ctx, &a).await,
            (
                Some(CreateWhat::RegistryCredentials {
                    name,
                    host,
                    username,
                }),
                _,
            ) => create_registry_credentials(ctx, &name, &host, &username).await,
            (Some(CreateWhat::Sshpublickey { name, file }), _) => {
                super::toolbox::create_sshpublickey(ctx, &name, &file).await
            }
            (Some(CreateWhat::Secret { what }), _) => match what {
                super::CreateSecretWhat::Sshpublickey { secret, name, file } => {
                    if secret != "admin" {
                        ctx.printer.warn(&format!(
                            "kprov keeps one SSH public key per cluster; the secret name {} is not kept",
                            untrusted(&secret)
                        ));
                    }
                    super::toolbox::create_sshpublickey(ctx, &name, &file).await
                }
            },
            (None, Some(f)) => objects_from_file(ctx, &f, Mode::Create).await,
            (None, None) => Err(anyhow!(
                "say what to create: `kprov create cluster NAME ...` or `kprov create -f FILE`"
            )),
        },
        Command::Replace(f) => objects_from_file(ctx, &f.file, Mode::Replace).await,
        Command::Get(g) => match g {
            GetWhat::Clusters { name, full, .. } => get_clusters(ctx, name.as_deref(), full).await,
            GetWhat::Addons { name, .. } => super::addons::get_addons(ctx, &name).await,
            GetWhat::Assets { name, .. } => super::bundle::get_assets(ctx, &name).await,
            GetWhat::Certificates { name, .. } => super::certificates::get(ctx, &name).await,
            GetWhat::Instances {
                name, kubeconfig, ..
            } => super::rolling::get_instances(ctx, &name, kubeconfig.as_deref()).await,
            GetWhat::Backups { name, .. } => super::etcd::list(ctx, &name).await,
            GetWhat::Secrets { name, .. } => get_secrets(ctx, &name).await,
            GetWhat::Instancegroups { cluster, name, .. } => {
                let cluster = cluster
                    .or(name)
                    .ok_or_else(|| anyhow!("name the cluster"))?;
                get_groups(ctx, &cluster).await
            }
        },
        Command::Edit(e) => match e {
            EditWhat::Cluster { name } => super::edit::edit(ctx, &name, None).await,
            EditWhat::Instancegroups { group, name } => {
                super::edit::edit(ctx, &name, Some(&group)).await
            }
        },
        Command::Delete(d) => match d {
            DeleteWhat::Cluster {
                name,
                yes,
                concurrency,
                delete_backups,
            } => delete_cluster(ctx, &name, yes, concurrency, delete_backups).await,
            DeleteWhat::Instancegroups { group, name, yes } => {
                delete_group(ctx, &name, &group, yes).await
            }
            DeleteWhat::Instance(a) => super::instance::delete_instance(ctx, &a).await,
            DeleteWhat::Damaged { name, yes } => delete_damaged(ctx, &name, yes).await,
        },
        Command::Forget(ForgetWhat::HostKey { cluster, host, yes }) => {
            super::metal::forget_host_key(ctx, &cluster, &host, yes).await
        }
        Command::Release(ReleaseWhat::Host {
            cluster,
            host,
            yes,
            accept_new_host_keys,
        }) => super::metal::release_host(ctx, &cluster, &host, yes, accept_new_host_keys).await,
        Command::Lock(l) => match l {
            LockWhat::Status { cluster } => lock_status(ctx, &cluster).await,
            LockWhat::Break { cluster } => lock_break(ctx, &cluster).await,
        },
        Command::Export(ExportWhat::Kubeconfig { name, kubeconfig }) => {
            export_kubeconfig(ctx, &name, kubeconfig.as_deref()).await
        }
        Command::RollingUpdate(RollingUpdateWhat::Cluster(a)) => {
            super::rolling::cluster(ctx, &a).await
        }
        Command::Update(u) => match u {
            UpdateWhat::Cluster(a) => super::update::cluster(ctx, &a).await,
            UpdateWhat::Addons(a) => {
                let args = super::addons::UpdateAddonsArgs {
                    name: &a.name,
                    yes: a.yes,
                    kubeconfig: a.kubeconfig.as_deref(),
                    force_conflicts: a.force_conflicts,
                    wait: a.wait,
                    exit_code: a.exit_code,
                    ssh_tunnel: a.ssh_tunnel,
                };
                super::addons::update_addons(ctx, &args).await
            }
        },
        Command::Validate(ValidateWhat::Cluster {
            name,
            wait,
            kubeconfig,
            ssh_tunnel,
            ..
        }) => super::addons::validate(ctx, &name, wait, kubeconfig.as_deref(), ssh_tunnel).await,
        Command::Rotate(RotateWhat::Certificates(a)) => super::certificates::rotate(ctx, &a).await,
        Command::Backup(BackupWhat::Etcd {
            name,
            ssh_private_address,
            ..
        }) => {
            let reach = crate::ops::platform::Reach {
                private_address: ssh_private_address,
            };
            super::etcd::backup(ctx, &name, reach).await
        }
        Command::Restore(RestoreWhat::Etcd {
            name,
            from,
            yes,
            ssh_private_address,
        }) => {
            let reach = crate::ops::platform::Reach {
                private_address: ssh_private_address,
            };
            super::etcd::restore(ctx, &name, &from, yes, reach).await
        }
        Command::Toolbox(super::ToolboxWhat::Dump {
            name,
            kubeconfig,
            no_api,
            ..
        }) => super::toolbox::dump(ctx, &name, kubeconfig.as_deref(), !no_api).await,
        Command::Version(_) => {
            crate::views::objects::version(&ctx.printer, env!("CARGO_PKG_VERSION"))?;
            Ok(exit::OK)
        }
        Command::Schema(s) => {
            ctx.printer.data(&schema_json(s.kind)?);
            Ok(exit::OK)
        }
        Command::Completion(c) => {
            let mut cmd = super::command();
            let mut buf = Vec::new();
            clap_complete::generate(c.shell, &mut cmd, "kprov", &mut buf);
            ctx.printer.data(&String::from_utf8_lossy(&buf));
            Ok(exit::OK)
        }
    }
}

async fn create_cluster(ctx: &Ctx, a: &CreateClusterArgs) -> anyhow::Result<i32> {
    use crate::ops::create;
    let inventory = match &a.inventory {
        Some(path) => Some(create::import_inventory(path)?),
        None => None,
    };
    let home = std::env::home_dir();
    let (key, skipped) = create::ssh_public_key(a.ssh_public_key.as_deref(), home.as_deref())?;
    for w in &skipped {
        ctx.printer.warn(w);
    }
    let plan = create::plan(&a.request(), inventory, key, &mut |n| {
        ctx.printer.status(&n)
    })
    .await?;
    view_create::inventory(&ctx.printer, &plan, a.dry_run);
    if a.dry_run {
        view_create::dry_run(&ctx.printer, &plan, a.output == DryRunFormat::Json)?;
        return Ok(exit::OK);
    }
    let repo = ctx.repo().await?;
    ctx.warn_versioning().await?;
    create::apply(&repo, &plan).await?;
    view_create::created(&ctx.printer, &plan, &repo.location());
    Ok(exit::OK)
}

/// `create -f` and `replace -f`: every cluster in the file is handled under its own lock.
async fn objects_from_file(ctx: &Ctx, path: &Path, mode: Mode) -> anyhow::Result<i32> {
    let (source, text) = objects::read_input(path)?;
    let objects = spec::load_objects(&source, &text)?;
    let mut per_cluster = group_by_cluster(objects)?;
    let repo = ctx.repo().await?;
    if mode == Mode::Create {
        ctx.warn_versioning().await?;
    }
    let mut said = |w: Written| view::written(&ctx.printer, w);
    objects::plan(&repo, &source, mode, &mut per_cluster, &mut said).await?;
    objects::apply(&repo, &source, mode, per_cluster, &mut said).await?;
    Ok(exit::OK)
}

/// `kprov create registry-credentials`: the password is the first line of standard input.
async fn create_registry_credentials(
    ctx: &Ctx,
    name: &str,
    host: &str,
    username: &str,
) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let stored =
        crate::ops::credentials::store_registry_credentials(&repo, name, host, username, || {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the password from standard input")?;
            Ok(line.trim_end_matches(['\n', '\r']).to_string())
        })
        .await?;
    view::registry_credentials(&ctx.printer, name, host, &stored);
    Ok(exit::OK)
}

/// `get secrets NAME`: the cluster's secrets by digest, never their bytes.
async fn get_secrets(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let rows = crate::ops::credentials::secrets(&repo, name).await?;
    view::secrets(&ctx.printer, &rows)?;
    Ok(exit::OK)
}

async fn get_clusters(ctx: &Ctx, name: Option<&str>, full: bool) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let list = objects::list(&repo, name).await?;
    view::clusters(&ctx.printer, &list, full, &repo.location())?;
    Ok(exit::OK)
}

async fn get_groups(ctx: &Ctx, cluster: &str) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let (user, groups) = objects::groups(&repo, cluster).await?;
    view::groups(&ctx.printer, &user, &groups)?;
    Ok(exit::OK)
}

async fn delete_cluster(
    ctx: &Ctx,
    name: &str,
    yes: bool,
    concurrency: usize,
    delete_backups: bool,
) -> anyhow::Result<i32> {
    use crate::ops::delete::{self as ops, DeleteError};
    let repo = ctx.repo().await?;
    let planned = match yes {
        true => ops::scope(&repo, name, delete_backups).await,
        false => ops::plan(&repo, name, delete_backups).await,
    };
    let plan = match planned {
        Ok(p) => p,
        Err(e @ DeleteError::OnlyBackupsLeft { .. }) => {
            ctx.printer.error(&e.to_string());
            return Ok(exit::ERROR);
        }
        Err(e) => return Err(delete_failed(ctx, e)),
    };
    if !yes {
        crate::views::delete::plan(&ctx.printer, &repo.location(), &plan);
        return Ok(exit::OK);
    }
    // Metal's hosts get a progress line each once they are known, under the lock.
    let bars = std::sync::Mutex::new(None);
    let events_for = |targets: &[Target]| {
        let (events, multi) = crate::views::nodes::node_events(&ctx.printer, targets);
        *bars.lock().unwrap_or_else(|p| p.into_inner()) = multi;
        events
    };
    let resume = format!(
        "kprov delete cluster {name} --yes{}",
        if delete_backups {
            " --delete-backups"
        } else {
            ""
        }
    );
    let ints = catch_interrupts(name, &resume);
    let session = ctx.session().await?;
    let outcome = ops::apply_interruptible(session, &plan, &ints, concurrency, &events_for).await;
    if let Some(bars) = bars.into_inner().unwrap_or_else(|p| p.into_inner()) {
        let _ = bars.clear();
    }
    let report = match outcome.map_err(|e| delete_failed(ctx, e))? {
        Err(c) => return Ok(interrupted(ctx, name, c, "deleting the cluster", &resume)),
        Ok(r) => r,
    };
    crate::views::delete::report(&ctx.printer, name, &repo.location(), &plan, report);
    Ok(exit::OK)
}

/// A `delete cluster` error as the command reports it: the warnings of hosts left alone
/// first, and the cause kept as it is for the exit code.
fn delete_failed(ctx: &Ctx, e: crate::ops::delete::DeleteError) -> anyhow::Error {
    use crate::ops::delete::DeleteError;
    match e {
        DeleteError::Lock(e) => e.into(),
        DeleteError::Failed(e) => e,
        e => {
            crate::views::delete::not_deleted(&ctx.printer, &e);
            e.into()
        }
    }
}

async fn delete_group(ctx: &Ctx, cluster: &str, group: &str, yes: bool) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let plan = objects::plan_group_delete(&repo, cluster, group).await?;
    if !yes {
        ctx.printer.data(&format!(
            "Will delete instance group {group} of cluster {cluster}."
        ));
        ctx.printer.status("Must specify --yes to delete.");
        return Ok(exit::OK);
    }
    ctx.session()
        .await?
        .with_lock(cluster, "delete instancegroup", async |guard| {
            objects::delete_group(&repo, &plan, guard).await
        })
        .await?;
    ctx.printer.success(&format!(
        "Deleted instance group {group} of cluster {cluster}."
    ));
    Ok(exit::OK)
}

async fn lock_status(ctx: &Ctx, cluster: &str) -> anyhow::Result<i32> {
    let store = ctx.store().await?;
    let status = locks::status(store.as_ref(), cluster).await?;
    view::lock_status(&ctx.printer, cluster, status.as_ref())?;
    Ok(exit::OK)
}

/// `kprov delete damaged NAME [--yes]`: the records of a cluster that fail the checks on
/// read, listed; with `--yes` removed under the cluster lock (`ops::damaged`).
async fn delete_damaged(ctx: &Ctx, name: &str, yes: bool) -> anyhow::Result<i32> {
    let session = ctx.session().await?;
    let store = session.store().as_ref();
    let plan = damaged::plan(store, name).await?;
    if plan.found.is_empty() {
        view::no_damaged(&ctx.printer, name);
        return Ok(exit::OK);
    }
    if !yes {
        view::damaged(&ctx.printer, name, &plan);
        return Ok(exit::OK);
    }
    let removed = session
        .with_lock(name, "delete damaged", async |guard| {
            damaged::apply(store, &plan, guard).await
        })
        .await?;
    for line in &removed {
        ctx.printer.success(&format!("removed {line}"));
    }
    Ok(exit::OK)
}

async fn lock_break(ctx: &Ctx, cluster: &str) -> anyhow::Result<i32> {
    let store = ctx.store().await?;
    let broken = locks::break_lock(store.as_ref(), cluster).await?;
    view::lock_broken(&ctx.printer, cluster, broken);
    Ok(exit::OK)
}

pub(crate) fn schema_json(kind: SchemaKind) -> anyhow::Result<String> {
    crate::views::objects::schema(match kind {
        SchemaKind::Cluster => crate::views::objects::Schema::Cluster,
        SchemaKind::Instancegroup => crate::views::objects::Schema::InstanceGroup,
        SchemaKind::All => crate::views::objects::Schema::All,
    })
}

async fn export_kubeconfig(ctx: &Ctx, name: &str, explicit: Option<&Path>) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let env = std::env::var("KUBECONFIG").ok();
    let home = std::env::home_dir();
    let path = crate::ops::credentials::export_kubeconfig(
        &repo,
        name,
        explicit,
        env.as_deref(),
        home.as_deref(),
    )
    .await?;
    ctx.printer.success(&format!(
        "kubeconfig for {name} written to {} (current context: {name})",
        path.display()
    ));
    Ok(exit::OK)
}
