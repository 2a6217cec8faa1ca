//! The human preview: "Will create / Will modify / Will replace / Will delete", grouped by kind,
//! `field: old -> new`, line diffs for documents, and a summary line.

use std::collections::BTreeMap;
use std::fmt::Write;

use console::Style;
use similar::{ChangeTag, TextDiff};

use super::model::Value;
use super::plan::{Action, Change, Plan};

/// How [`render_text`] prints a plan (`Default`: no colour, deletions shown as skipped).
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    /// ANSI colour; the CLI turns it on for a terminal.
    pub(crate) color: bool,
    /// Whether deletions will be applied (`--prune`); otherwise they are listed as skipped.
    pub(crate) prune: bool,
}

struct Styles {
    add: Style,
    del: Style,
    change: Style,
    head: Style,
}

impl Styles {
    fn new(color: bool) -> Self {
        let s = |st: Style| st.force_styling(color);
        Styles {
            add: s(Style::new().green()),
            del: s(Style::new().red()),
            change: s(Style::new().yellow()),
            head: s(Style::new().bold()),
        }
    }
}

/// The plan as the preview prints it: its warnings and errors, the changes by action and kind
/// with their fields, and the summary line.
pub fn render_text(plan: &Plan, opts: RenderOptions) -> String {
    let st = Styles::new(opts.color);
    let mut out = String::new();
    for w in &plan.warnings {
        let _ = writeln!(out, "{} {w}", st.change.apply_to("Warning:"));
    }
    for e in &plan.errors {
        let _ = writeln!(out, "{} {e}", st.del.apply_to("Error:"));
    }
    if !plan.warnings.is_empty() || !plan.errors.is_empty() {
        out.push('\n');
    }
    let sections = [
        (Action::Create, "Will create resources:"),
        (Action::Update, "Will modify resources:"),
        (
            Action::Replace,
            "Will replace resources (delete, then create):",
        ),
        (
            Action::Delete,
            if opts.prune {
                "Will delete resources:"
            } else {
                "Would delete resources (owned but no longer in the spec; run with --prune):"
            },
        ),
    ];
    for (action, title) in sections {
        let mut by_kind: BTreeMap<&str, Vec<&Change>> = BTreeMap::new();
        for c in plan.changes.iter().filter(|c| c.action == action) {
            by_kind.entry(&c.kind).or_default().push(c);
        }
        if by_kind.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{}", st.head.apply_to(title));
        for (kind, changes) in by_kind {
            let _ = writeln!(out, "  {kind}");
            for c in changes {
                let mark = match action {
                    Action::Create => st.add.apply_to("+"),
                    Action::Delete => st.del.apply_to("-"),
                    Action::Update => st.change.apply_to("~"),
                    Action::Replace => st.change.apply_to("±"),
                };
                match &c.cloud_id {
                    Some(cid) => {
                        let _ = writeln!(out, "    {mark} {} ({cid})", c.name);
                    }
                    None => {
                        let _ = writeln!(out, "    {mark} {}", c.name);
                    }
                }
                for f in &c.fields {
                    render_field(&mut out, &st, action, &f.field, &f.old, &f.new);
                }
            }
        }
        out.push('\n');
    }
    let s = &plan.summary;
    if s.total() == 0 {
        out.push_str("No changes: the cloud matches the spec.\n");
    } else {
        let _ = writeln!(
            out,
            "Plan: {} to create, {} to modify, {} to replace, {} to delete{}.",
            s.create,
            s.update,
            s.replace,
            s.delete,
            if s.delete > 0 && !opts.prune {
                " (deletions need --prune)"
            } else {
                ""
            }
        );
    }
    out
}

fn render_field(
    out: &mut String,
    st: &Styles,
    action: Action,
    name: &str,
    old: &Option<Value>,
    new: &Option<Value>,
) {
    const PAD: &str = "        ";
    match (old, new) {
        (_, Some(Value::Doc(n))) => {
            let o = match old {
                Some(Value::Doc(o)) => o.as_str(),
                _ => "",
            };
            let _ = writeln!(out, "      {name}:");
            if action == Action::Create {
                for l in n.lines() {
                    let _ = writeln!(out, "{PAD}{l}");
                }
                return;
            }
            let diff = TextDiff::from_lines(o, n.as_str());
            for group in diff.grouped_ops(2) {
                for op in group {
                    for ch in diff.iter_changes(&op) {
                        let line = ch.value().trim_end_matches('\n');
                        let _ = match ch.tag() {
                            ChangeTag::Delete => {
                                writeln!(out, "{PAD}{}", st.del.apply_to(format!("-{line}")))
                            }
                            ChangeTag::Insert => {
                                writeln!(out, "{PAD}{}", st.add.apply_to(format!("+{line}")))
                            }
                            ChangeTag::Equal => writeln!(out, "{PAD} {line}"),
                        };
                    }
                }
            }
        }
        (None, Some(n)) => {
            let _ = writeln!(out, "      {name}: {n}");
        }
        (Some(Value::List(o)), Some(Value::List(n))) if action != Action::Create => {
            // Sets (rules, subnets): what goes and what comes, not two long lines.
            let _ = writeln!(out, "      {name}:");
            for v in o.iter().filter(|v| !n.contains(v)) {
                let _ = writeln!(out, "{PAD}{}", st.del.apply_to(format!("- {v}")));
            }
            for v in n.iter().filter(|v| !o.contains(v)) {
                let _ = writeln!(out, "{PAD}{}", st.add.apply_to(format!("+ {v}")));
            }
        }
        (Some(o), Some(n)) => {
            let _ = writeln!(
                out,
                "      {name}: {} -> {}",
                st.del.apply_to(o),
                st.add.apply_to(n)
            );
        }
        (Some(o), None) => {
            let _ = writeln!(out, "      {name}: {} -> (none)", st.del.apply_to(o));
        }
        (None, None) => {}
    }
}
