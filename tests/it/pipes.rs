//! Bad days on pipes (a CI log, `2> file`, `| tee`): failing commands with stdout and stderr
//! as pipes and a colour terminal's TERM, NO_COLOR unset (the harness sets it elsewhere), with
//! and without `-v`. No ESC byte may reach either stream (no coloured tracing line, no
//! spinner); an unreachable API is named by its URL, not kube-rs's "client error (Connect)";
//! an unreachable host is named; the rolling-update preview says READY `?` for groups whose
//! Ready the API could not tell (not 0), and counts in the singular when there is one.
//! Needs root (sshd test hosts).

use crate::metal::{Lab, text};

/// `kprov ARGS` as in a CI job: pipes, a colour TERM, no NO_COLOR.
fn on_pipes(lab: &Lab, args: &[&str]) -> std::process::Output {
    lab.kprov_command(args)
        .env_remove("NO_COLOR")
        .env("TERM", "xterm-256color")
        .env("COLORTERM", "truecolor")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runs kprov")
}

/// Asserts neither stream holds an ESC byte or a count with a plural after 1; returns stderr.
#[track_caller]
fn plain(args: &[&str], o: &std::process::Output) -> String {
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let shown = format!(
        "kprov {}\nexit {:?}\nstdout:\n{out}\nstderr:\n{err}",
        args.join(" "),
        o.status.code()
    );
    for (stream, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
        assert!(!bytes.contains(&0x1b), "ESC on {stream}:\n{shown}");
    }
    for line in out.lines().chain(err.lines()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for w in words.windows(2) {
            assert!(
                !(w[0] == "1"
                    && [
                        "nodes",
                        "hosts",
                        "instances",
                        "problems",
                        "changes",
                        "steps",
                        "groups",
                        "members",
                        "objects"
                    ]
                    .contains(&w[1].trim_end_matches([',', '.', ':', ')']))),
                "\"1 {}\":\n{shown}",
                w[1]
            );
        }
    }
    eprintln!("{shown}");
    err
}

#[test]
fn failing_commands_on_pipes_print_no_escape_and_name_the_api_url_and_the_host() {
    crate::needs_tier!(SshdHosts);
    let name = "pipes.metal.example.com";
    let lab = Lab::with_control_plane_and_worker(name);
    lab.provision(name);
    // An API server address nothing listens on: a loopback port this test bound and closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("https://127.0.0.1:{port}");
    let kc = lab.write(
        "kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{token: t}}\n"
        ),
    );

    // 1. The API does not answer: named by its URL, with and without -v (tracing lines).
    for verbose in [false, true] {
        let mut args = vec!["validate", "cluster", name, "--kubeconfig", &kc];
        if verbose {
            args.insert(0, "-v");
        }
        let o = on_pipes(&lab, &args);
        let err = plain(&args, &o);
        assert_ne!(o.status.code(), Some(0), "{err}");
        assert!(err.contains(&url), "the API's URL is not named:\n{err}");
        assert!(!err.contains("client error (Connect)"), "{err}");
        if !verbose {
            // No tracing line of a library before kprov's own error.
            assert!(
                !err.lines()
                    .any(|l| l.contains(" ERROR ") || l.contains(" WARN ")),
                "a raw tracing line:\n{err}"
            );
        }
    }

    // 2. The rolling-update preview with that API: the hosts answer (one needs a roll), Ready
    //    is unknown: `?`, not 0; one node to roll is "1 node".
    lab.edit_cluster(name, |c| {
        for h in c.spec.hosts.iter_mut() {
            if h.name == "host2" {
                h.labels.insert("tier".into(), "web".into());
            }
        }
    });
    let args = ["rolling-update", "cluster", name, "--kubeconfig", &kc];
    let o = on_pipes(&lab, &args);
    let err = plain(&args, &o);
    let out = text(&o.stdout);
    let ready_column = |line: &str| line.split_whitespace().nth(3).map(str::to_string);
    let header = out
        .lines()
        .find(|l| l.starts_with("NAME") && l.contains("READY"))
        .unwrap_or_else(|| panic!("no group table:\n{out}\n{err}"));
    assert_eq!(ready_column(header).as_deref(), Some("READY"), "{out}");
    for group in ["control-plane", "nodes"] {
        let row = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(group))
            .unwrap_or_else(|| panic!("no {group} row:\n{out}"));
        assert_eq!(ready_column(row).as_deref(), Some("?"), "{out}");
    }
    assert!(err.contains(&url), "{err}");
    assert!(
        format!("{out}{err}").contains("1 node would roll."),
        "{out}\n{err}"
    );

    // 3. A host that does not answer (powered off): named, still no ESC, with -v too.
    lab.host("host2").power_off();
    for args in [
        vec!["update", "cluster", name, "--yes", "--skip-addons"],
        vec!["-v", "get", "instances", name, "--kubeconfig", &kc],
    ] {
        let o = on_pipes(&lab, &args);
        let err = plain(&args, &o);
        let all = format!("{}{err}", text(&o.stdout));
        assert!(all.contains("host2"), "the host is not named:\n{all}");
        if args[0] == "update" {
            assert_ne!(o.status.code(), Some(0), "{all}");
        }
    }
}
