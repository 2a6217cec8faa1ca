//! Waiting for new instances, bounded and visible: after the cloud apply, each group's
//! instances must be running and answering SSH before the node layer connects.
//!
//! "Answering SSH" means the address accepts a TCP connection and sends an SSH identification
//! line (`SSH-2.0-...`, RFC 4253 §4.2); authentication and the host key are the SSH layer's
//! business. Targets reached through a jump host cannot be probed from here: they are reported
//! as deferred (the SSH connection through the bastion waits for them itself).
//!
//! Caveat: the probe reads at most one short line from the address and nothing else; it never
//! connects to an address that is not a target's.

use crate::output::UntrustedText;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

use crate::nodes::Target;

/// The longest identification line read (RFC 4253 allows 255 bytes).
const MAX_BANNER: usize = 255;

/// One instance's progress, for the printer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WaitEvent {
    /// Not answering yet (the error of the last attempt).
    Waiting {
        /// The instance's ID.
        instance: String,
        /// The last attempt's error.
        last: UntrustedText,
    },
    /// Its SSH server answered (sent once per instance).
    Answering {
        /// The instance's ID.
        instance: String,
        /// The identification line the instance sent: its text, not kprov's.
        banner: UntrustedText,
    },
    /// Reached through a jump host: the SSH connection waits for it.
    Deferred {
        /// The instance's ID.
        instance: String,
    },
}

/// Probes one `host:port` once: connects and reads the identification line.
pub(crate) async fn probe(address: &str, port: u16, per_try: Duration) -> Result<String, String> {
    let attempt = async {
        let mut s = TcpStream::connect((address, port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut buf = vec![0u8; MAX_BANNER];
        let mut got = 0;
        while got < buf.len() {
            let n = s
                .read(&mut buf[got..])
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            got += n;
            if buf[..got].contains(&b'\n') {
                break;
            }
        }
        let text = String::from_utf8_lossy(&buf[..got]);
        // why: an empty banner is no first line
        let line = text.lines().next().unwrap_or_default().trim().to_string();
        if line.starts_with("SSH-") {
            Ok(line)
        } else {
            Err(format!("not an SSH server (said {line:?})"))
        }
    };
    timeout(per_try, attempt)
        .await
        .map_err(|_| format!("no answer within {}s", per_try.as_secs()))?
}

/// Waits until every directly reachable target answers SSH, or the deadline passes. Returns
/// the instances still not answering, each with its last error.
pub(crate) async fn wait_for_ssh(
    targets: &[Target],
    deadline: Duration,
    interval: Duration,
    on_event: &(dyn Fn(WaitEvent) + Send + Sync),
) -> Result<(), Vec<(String, String)>> {
    let end = Instant::now() + deadline;
    let mut pending: Vec<&Target> = Vec::new();
    for t in targets {
        if t.host.bastion.is_some() {
            on_event(WaitEvent::Deferred {
                instance: t.name().to_string(),
            });
        } else {
            pending.push(t);
        }
    }
    let mut last: Vec<(String, String)> = Vec::new();
    loop {
        last.clear();
        let per_try = interval
            .max(Duration::from_secs(1))
            .min(Duration::from_secs(5));
        let probes = pending.iter().map(|t| async move {
            let r = probe(&t.host.address, t.host.port.unwrap_or(22), per_try).await;
            (*t, r)
        });
        let mut still = Vec::new();
        for (t, r) in futures::future::join_all(probes).await {
            match r {
                Ok(banner) => on_event(WaitEvent::Answering {
                    instance: t.name().to_string(),
                    banner: banner.into(),
                }),
                Err(e) => {
                    on_event(WaitEvent::Waiting {
                        instance: t.name().to_string(),
                        last: e.as_str().into(),
                    });
                    last.push((t.name().to_string(), e));
                    still.push(t);
                }
            }
        }
        pending = still;
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() + interval > end {
            return Err(last);
        }
        sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    fn target(name: &str, port: u16, bastion: Option<&str>) -> Target {
        Target::from_host(crate::spec::Host {
            name: name.into(),
            address: "127.0.0.1".into(),
            ip: None,
            access_ip: None,
            user: None,
            port: Some(port),
            key_path: None,
            bastion: bastion.map(str::to_string),
            roles: vec![],
            labels: Default::default(),
            taints: vec![],
        })
    }

    async fn server(banner: &'static [u8]) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = s.write_all(banner).await;
            }
        });
        port
    }

    #[tokio::test]
    async fn waits_until_every_instance_answers_or_names_the_late_ones() {
        let ssh = server(b"SSH-2.0-OpenSSH_9.6\r\n").await;
        let http = server(b"HTTP/1.1 400 Bad Request\r\n").await;
        // A port nothing listens on: bind, note it, drop it.
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let events = events.clone();
            move |e: WaitEvent| events.lock().unwrap().push(e)
        };
        let ts = [
            target("i-ok", ssh, None),
            target("i-web", http, None),
            target("i-down", closed, None),
            target("i-private", closed, Some("admin@bastion")),
        ];
        let started = Instant::now();
        let late = wait_for_ssh(
            &ts,
            Duration::from_millis(300),
            Duration::from_millis(100),
            &sink,
        )
        .await
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3), "bounded");
        let names: Vec<&str> = late.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["i-web", "i-down"]);
        assert!(late[0].1.contains("not an SSH server"), "{late:?}");
        let ev = events.lock().unwrap().clone();
        assert!(ev.contains(&WaitEvent::Deferred {
            instance: "i-private".into()
        }));
        assert!(
            ev.iter()
                .any(|e| matches!(e, WaitEvent::Answering { instance, banner }
            if instance == "i-ok" && *banner == UntrustedText::from("SSH-2.0-OpenSSH_9.6")))
        );
        assert!(
            ev.iter()
                .filter(
                    |e| matches!(e, WaitEvent::Waiting { instance, .. } if instance == "i-down")
                )
                .count()
                >= 2,
            "retried until the deadline: {ev:?}"
        );

        // All answering: done at once.
        wait_for_ssh(
            &ts[..1],
            Duration::from_secs(5),
            Duration::from_millis(100),
            &sink,
        )
        .await
        .unwrap();
    }
}
