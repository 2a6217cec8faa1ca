//! An HTTP/1.1 proxy on loopback in front of moto_server that injects the faults AWS shows
//! under load: throttling (EC2 `RequestLimitExceeded` 503, S3 `SlowDown` 503, everything else
//! `Throttling` 400), 500 `InternalError`s, requests cut half-way through their body, and
//! replies lost after the server acted; and AWS as it really behaves where moto is instantly
//! consistent ([`Fault::Answer`]: an instance profile refused for a while after its creation,
//! an ID not found yet).
//!
//! Point a client at `endpoint` instead of moto's. A [`Policy`] decides per request. Policies
//! decide from the request's content (method, path, body) and how often that exact request was
//! seen, never from arrival order, so the same seed gives the same faults however a parallel
//! client orders its calls. Every connection is closed after one exchange (`Connection:
//! close`), which keeps the proxy simple and the client's pool honest.
//!
//! Caveat: only what the SDK sends to moto is handled (Content-Length or chunked bodies, no
//! `Expect: 100-continue`, no TLS).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// What the proxy does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The service's throttling error (not forwarded).
    Throttle,
    /// 500 InternalError (not forwarded).
    Internal,
    /// Forwards the head and half the body to the server, then closes both connections.
    CutRequest,
    /// Forwards the request, lets the server act, and closes the client's connection without
    /// a reply.
    LoseReply,
    /// Answers with this service error (not forwarded): how AWS answers while a change has
    /// not propagated (an instance profile refused, a new ID not found yet).
    Answer(AwsError),
    /// Answers 200 with this XML body (not forwarded): what AWS shows while it has not acted
    /// yet (no instance of a new Auto Scaling group, a failed scaling activity).
    Reply(&'static str),
}

/// DescribeInstances with nothing in it: instances Auto Scaling has not launched yet.
pub const NO_INSTANCES: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>fault-proxy</requestId><reservationSet/></DescribeInstancesResponse>";

/// A DescribeScalingActivities reply holding one failed launch of `group`, started now,
/// with Auto Scaling's `reason` (leaked: a policy's replies live as long as the test).
pub fn failed_activity(group: &str, reason: &str) -> &'static str {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let start = aws_smithy_types::DateTime::from_secs(now as i64)
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .unwrap_or_default();
    Box::leak(
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeScalingActivitiesResponse xmlns=\"http://autoscaling.amazonaws.com/doc/2011-01-01/\"><DescribeScalingActivitiesResult><Activities><member><ActivityId>fault-proxy-{now}</ActivityId><AutoScalingGroupName>{group}</AutoScalingGroupName><Description>Launching a new EC2 instance.  Status Reason: {reason}. Launching EC2 instance failed.</Description><Cause>At {start} an instance was started in response to a difference between desired and actual capacity.</Cause><StartTime>{start}</StartTime><StatusCode>Failed</StatusCode><StatusMessage>{reason}. Launching EC2 instance failed.</StatusMessage><Progress>100</Progress></member></Activities></DescribeScalingActivitiesResult><ResponseMetadata><RequestId>fault-proxy</RequestId></ResponseMetadata></DescribeScalingActivitiesResponse>"
        )
        .into_boxed_str(),
    )
}

/// A service error as AWS sends it: HTTP status, code and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AwsError {
    pub status: u16,
    pub code: &'static str,
    pub message: &'static str,
}

impl AwsError {
    /// What Auto Scaling answers for a launch template naming an instance profile IAM has
    /// not propagated yet (terraform-provider-aws #5633, eksctl #8039).
    pub const PROFILE_NOT_PROPAGATED: AwsError = AwsError {
        status: 400,
        code: "ValidationError",
        message: "You must use a valid fully-formed launch template. Value (profile) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name",
    };
    /// IAM's "not found" (a profile or role created a moment ago, not visible yet).
    pub const NO_SUCH_ENTITY: AwsError = AwsError {
        status: 404,
        code: "NoSuchEntity",
        message: "The instance profile cannot be found.",
    };
}

/// One request as the policy sees it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// From the SigV4 credential scope: `ec2`, `s3`, `autoscaling`, `route53`, ...
    pub service: String,
    /// `Action=` of query-protocol calls (EC2, Auto Scaling, ELB, IAM); empty otherwise.
    pub action: String,
    /// How many times this exact request (method, path, body) arrived before, this one
    /// excluded: 0 on the first attempt, 1 on the SDK's first retry of it, ...
    pub seen: u32,
    /// The body as text (query-protocol parameters: `NatGatewayId.1=...`).
    pub body: String,
    /// sha256 of method, path and body.
    pub key: [u8; 32],
    /// Since the proxy started.
    pub at: Duration,
}

impl Request {
    /// A number in 0..100 fixed by the request's content and `seed`.
    pub fn percentile(&self, seed: u64) -> u64 {
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update(self.key);
        let d = h.finalize();
        u64::from_le_bytes(d[..8].try_into().unwrap_or_default()) % 100
    }

    /// Reads (Describe/List/Get) are safe to repeat; anything else changes something.
    pub fn is_write(&self) -> bool {
        if !self.action.is_empty() {
            return !["Describe", "List", "Get"]
                .iter()
                .any(|p| self.action.starts_with(p));
        }
        !matches!(self.method.as_str(), "GET" | "HEAD")
    }
}

pub type Policy = Box<dyn FnMut(&Request) -> Option<Fault> + Send>;

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub requests: u64,
    pub injected: HashMap<Fault, u64>,
    /// Faults by service and fault, for the figures.
    pub by_service: std::collections::BTreeMap<String, u64>,
}

impl Stats {
    pub fn total_injected(&self) -> u64 {
        self.injected.values().sum()
    }
}

struct Shared {
    policy: Mutex<Policy>,
    stats: Mutex<Stats>,
    seen: Mutex<HashMap<[u8; 32], u32>>,
    upstream: String,
    started: Instant,
    stop: AtomicBool,
}

pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy to `upstream` (`http://127.0.0.1:PORT`, loopback only) that injects nothing
    /// until a policy is set.
    pub fn start(upstream: &str) -> FaultProxy {
        let upstream = upstream
            .strip_prefix("http://")
            .unwrap_or(upstream)
            .trim_end_matches('/')
            .to_string();
        assert!(
            upstream.starts_with("127.0.0.1:"),
            "the fault proxy only forwards to loopback, not {upstream}"
        );
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind fault proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            policy: Mutex::new(Box::new(|_: &Request| None)),
            stats: Mutex::new(Stats::default()),
            seen: Mutex::new(HashMap::new()),
            upstream,
            started: Instant::now(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = handle(&s, conn);
                });
            }
        });
        FaultProxy {
            endpoint: format!("http://{addr}"),
            shared,
            addr,
            thread: Some(thread),
        }
    }

    pub fn set_policy(&self, policy: Policy) {
        *self.shared.policy.lock().expect("policy") = policy;
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().expect("stats").clone()
    }

    /// The environment that points the AWS SDK's default chain at this proxy, with the SDK's
    /// default retry policy (unlike the moto helper's single attempt).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads a request: head lines and the raw body (chunked bodies kept encoded).
fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<(Vec<String>, Vec<u8>)>> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let header = |name: &str| {
        head.iter().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let mut body = Vec::new();
    if let Some(n) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            body.extend_from_slice(size.as_bytes());
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
            if n == 0 {
                break;
            }
        }
    }
    Ok(Some((head, body)))
}

fn describe(s: &Shared, head: &[String], body: &[u8]) -> Request {
    let mut parts = head.first().map(|l| l.split(' ')).into_iter().flatten();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let auth = head
        .iter()
        .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
        .cloned()
        .unwrap_or_default();
    // Credential=AKID/DATE/REGION/SERVICE/aws4_request
    let service = auth
        .split("Credential=")
        .nth(1)
        .and_then(|c| c.split('/').nth(3))
        .unwrap_or_default()
        .to_string();
    let query = path.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let body_text = String::from_utf8_lossy(body);
    let action = query
        .split('&')
        .chain(body_text.split('&'))
        .find_map(|kv| kv.strip_prefix("Action="))
        .unwrap_or_default()
        .to_string();
    let mut h = Sha256::new();
    h.update(method.as_bytes());
    h.update(b" ");
    h.update(path.as_bytes());
    h.update(b"\n");
    h.update(body);
    let key: [u8; 32] = h.finalize().into();
    let seen = {
        let mut seen = s.seen.lock().expect("seen");
        let n = seen.entry(key).or_insert(0);
        *n += 1;
        *n - 1
    };
    Request {
        method,
        path,
        service,
        action,
        seen,
        body: body_text.into_owned(),
        key,
        at: s.started.elapsed(),
    }
}

fn error_reply(service: &str, fault: Fault) -> Vec<u8> {
    let (status, code, message) = match (service, fault) {
        (_, Fault::Answer(e)) => (e.status, e.code, e.message),
        ("ec2", Fault::Throttle) => (503, "RequestLimitExceeded", "Request limit exceeded."),
        ("s3", Fault::Throttle) => (503, "SlowDown", "Please reduce your request rate."),
        (_, Fault::Throttle) => (400, "Throttling", "Rate exceeded"),
        ("s3" | "ec2", _) => (
            500,
            "InternalError",
            "We encountered an internal error. Please try again.",
        ),
        _ => (500, "InternalFailure", "An internal error occurred."),
    };
    let body = match service {
        "ec2" => format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>fault-proxy</RequestID></Response>"
        ),
        "s3" => format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
        ),
        _ => format!(
            "<?xml version=\"1.0\"?>\n<ErrorResponse><Error><Type>{}</Type><Code>{code}</Code><Message>{message}</Message></Error><RequestId>fault-proxy</RequestId></ErrorResponse>",
            if status < 500 { "Sender" } else { "Receiver" }
        ),
    };
    let reason = match status {
        400 => "Bad Request",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nx-amz-request-id: fault-proxy\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The request as sent upstream: `Connection: close` so the server ends the reply with EOF.
fn upstream_head(head: &[String]) -> Vec<u8> {
    let mut out = String::new();
    for (i, l) in head.iter().enumerate() {
        if i > 0 && l.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

/// The reply as returned to the client, with `Connection: close` (this proxy closes after
/// one exchange).
fn client_reply(reply: &[u8]) -> Vec<u8> {
    let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n") else {
        return reply.to_vec();
    };
    let head = String::from_utf8_lossy(&reply[..end]);
    let mut out = String::new();
    for l in head.split("\r\n") {
        if l.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&reply[end + 4..]);
    bytes
}

fn handle(s: &Shared, conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut client = conn;
    let Some((head, body)) = read_request(&mut reader)? else {
        return Ok(());
    };
    let req = describe(s, &head, &body);
    let fault = (s.policy.lock().expect("policy"))(&req);
    {
        let mut st = s.stats.lock().expect("stats");
        st.requests += 1;
        if let Some(f) = fault {
            *st.injected.entry(f).or_insert(0) += 1;
            *st.by_service
                .entry(format!("{} {f:?}", req.service))
                .or_insert(0) += 1;
        }
    }
    match fault {
        Some(Fault::Reply(body)) => {
            client.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nx-amz-request-id: fault-proxy\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )?;
            client.flush()?;
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        Some(f @ (Fault::Throttle | Fault::Internal | Fault::Answer(_))) => {
            client.write_all(&error_reply(&req.service, f))?;
            client.flush()?;
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        Some(Fault::CutRequest) => {
            let mut up = TcpStream::connect(&s.upstream)?;
            up.write_all(&upstream_head(&head))?;
            up.write_all(&body[..body.len() / 2])?;
            up.flush()?;
            let _ = up.shutdown(Shutdown::Both);
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        _ => {}
    }
    let mut up = TcpStream::connect(&s.upstream)?;
    up.set_read_timeout(Some(Duration::from_secs(60)))?;
    up.write_all(&upstream_head(&head))?;
    up.write_all(&body)?;
    up.flush()?;
    let mut reply = Vec::new();
    up.read_to_end(&mut reply)?;
    if fault == Some(Fault::LoseReply) {
        let _ = client.shutdown(Shutdown::Both);
        return Ok(());
    }
    client.write_all(&client_reply(&reply))?;
    client.flush()?;
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}
