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
    /// S3's answer to a request signed for another region than the bucket's (not
    /// forwarded): 301 `PermanentRedirect` with the bucket's region in `x-amz-bucket-region`.
    WrongRegion(&'static str),
}

/// DescribeInstances with nothing in it: instances Auto Scaling has not launched yet.
pub const NO_INSTANCES: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>fault-proxy</requestId><reservationSet/></DescribeInstancesResponse>";

/// DescribeAccountAttributes of the lab's default account: its Elastic IP quota raised to 100,
/// as an account where many clusters (here: the tests, side by side) live would have it. moto
/// answers 5, AWS's default, for every account; a test's own account (`x-moto-account-id`)
/// keeps that.
pub const RAISED_ADDRESS_QUOTA: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeAccountAttributesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>fault-proxy</requestId><accountAttributeSet><item><attributeName>vpc-max-elastic-ips</attributeName><attributeValueSet><item><attributeValue>100</attributeValue></item></attributeValueSet></item></accountAttributeSet></DescribeAccountAttributesResponse>";

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
    /// From the SigV4 credential scope: the region the request is signed for.
    pub region: String,
    /// `Action=` of query-protocol calls (EC2, Auto Scaling, ELB, IAM); empty otherwise.
    pub action: String,
    /// How many times this exact request (method, path, body) arrived before, this one
    /// excluded: 0 on the first attempt, 1 on the SDK's first retry of it, ...
    pub seen: u32,
    /// The body as text (query-protocol parameters: `NatGatewayId.1=...`).
    pub body: String,
    /// moto's `x-moto-account-id` header (a test's own account), empty for the default one.
    pub account: String,
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

/// Sees every reply the server sent (the request, the raw HTTP reply): how a policy learns
/// what AWS just created (an ID's birth, for the as-it-is windows).
pub type Observer = Box<dyn FnMut(&Request, &[u8]) + Send>;

/// Opens a connection to the server (in a network namespace, for the cloud lab).
pub type Dial = Arc<dyn Fn() -> std::io::Result<TcpStream> + Send + Sync>;

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
    observer: Mutex<Option<Observer>>,
    stats: Mutex<Stats>,
    seen: Mutex<HashMap<[u8; 32], u32>>,
    dial: Dial,
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
        FaultProxy::start_with(listener, Arc::new(move || TcpStream::connect(&upstream)))
    }

    /// A proxy answering on `listener` (bound wherever the client is, a lab's namespace
    /// included) that reaches the server through `dial`.
    pub fn start_with(listener: TcpListener, dial: Dial) -> FaultProxy {
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            policy: Mutex::new(Box::new(|_: &Request| None)),
            observer: Mutex::new(None),
            stats: Mutex::new(Stats::default()),
            seen: Mutex::new(HashMap::new()),
            dial,
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

    pub fn set_observer(&self, observer: Observer) {
        *self.shared.observer.lock().expect("observer") = Some(observer);
    }

    /// Turns on AWS as it is (see [`AsItIs`]), seeded.
    pub fn set_as_it_is(&self, seed: u64) -> AsItIs {
        let a = AsItIs::new(seed);
        self.set_policy(a.policy());
        self.set_observer(a.observer());
        a
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().expect("stats").clone()
    }

    /// The environment that points the AWS SDK's default chain at this proxy, with the SDK's
    /// default retry policy (unlike the moto helper's single attempt).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        super::moto::sdk_env(&self.endpoint)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag. A listener in another network namespace
        // may not be reachable from here: its thread is then left blocked (harmless in a
        // test process) rather than joined forever.
        let woke = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok();
        if let Some(t) = self.thread.take()
            && woke
        {
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
    let credential = |n: usize| {
        auth.split("Credential=")
            .nth(1)
            .and_then(|c| c.split('/').nth(n))
            .unwrap_or_default()
            .to_string()
    };
    let (service, region) = (credential(3), credential(2));
    let account = head
        .iter()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("x-moto-account-id")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
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
        region,
        action,
        seen,
        body: body_text.into_owned(),
        account,
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
        Some(Fault::WrongRegion(region)) => {
            let body = if req.method == "HEAD" {
                String::new()
            } else {
                format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>PermanentRedirect</Code><Message>The bucket you are attempting to access must be addressed using the specified endpoint. Please send all future requests to this endpoint.</Message><BucketRegion>{region}</BucketRegion><RequestId>fault-proxy</RequestId></Error>"
                )
            };
            client.write_all(
                format!(
                    "HTTP/1.1 301 Moved Permanently\r\nContent-Type: application/xml\r\nx-amz-bucket-region: {region}\r\nContent-Length: {}\r\nx-amz-request-id: fault-proxy\r\nConnection: close\r\n\r\n{}",
                    body.len(),
                    if req.method == "HEAD" { "" } else { body.as_str() }
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
            let mut up = (s.dial)()?;
            up.write_all(&upstream_head(&head))?;
            up.write_all(&body[..body.len() / 2])?;
            up.flush()?;
            let _ = up.shutdown(Shutdown::Both);
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        _ => {}
    }
    let mut up = (s.dial)()?;
    up.set_read_timeout(Some(Duration::from_secs(60)))?;
    up.write_all(&upstream_head(&head))?;
    up.write_all(&body)?;
    up.flush()?;
    let mut reply = Vec::new();
    up.read_to_end(&mut reply)?;
    if let Some(o) = s.observer.lock().expect("observer").as_mut() {
        o(&req, &reply);
    }
    if fault == Some(Fault::LoseReply) {
        let _ = client.shutdown(Shutdown::Both);
        return Ok(());
    }
    client.write_all(&client_reply(&reply))?;
    client.flush()?;
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}

/// Percent-decodes a query-protocol value (`+` is a space).
fn decode(v: &str) -> String {
    percent_encoding::percent_decode_str(&v.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// The query-protocol parameters of a request (body and query string), decoded.
pub fn params(r: &Request) -> Vec<(String, String)> {
    let query = r.path.split_once('?').map(|(_, q)| q).unwrap_or_default();
    query
        .split('&')
        .chain(r.body.split('&'))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// EC2 ID prefixes and the code EC2 answers for one it does not know (yet).
const EC2_IDS: &[(&str, &str)] = &[
    ("vpc", "InvalidVpcID.NotFound"),
    ("subnet", "InvalidSubnetID.NotFound"),
    ("igw", "InvalidInternetGatewayID.NotFound"),
    ("rtb", "InvalidRouteTableID.NotFound"),
    ("sg", "InvalidGroup.NotFound"),
    ("nat", "InvalidNatGatewayID.NotFound"),
    ("eipalloc", "InvalidAllocationID.NotFound"),
    ("i", "InvalidInstanceID.NotFound"),
];

/// `vpc-0a1b2c3d` → its not-found code.
fn ec2_id_code(token: &str) -> Option<&'static str> {
    let (prefix, hex) = token.split_once('-')?;
    if hex.len() < 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    EC2_IDS
        .iter()
        .find(|(p, _)| *p == prefix)
        .map(|(_, code)| *code)
}

fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|t| !t.is_empty())
}

/// The windows of [`AsItIs`], each a fixed function of the seed and the name it applies to.
#[derive(Debug, Clone, Copy)]
pub struct Windows {
    /// After CreateInstanceProfile: Auto Scaling refuses a group whose launch template names
    /// the profile; IAM answers NoSuchEntity for the first half of it.
    pub profile: (u64, u64),
    /// After an EC2 create returned an ID: writes naming it answer `*.NotFound`.
    pub id: (u64, u64),
    /// After CreateAutoScalingGroup: DescribeInstances of the cluster shows none.
    pub launch: (u64, u64),
}

impl Default for Windows {
    /// Short enough that the whole AWS suite grows by well under a minute.
    fn default() -> Self {
        Windows {
            profile: (1000, 2500),
            id: (300, 1000),
            launch: (1500, 3000),
        }
    }
}

#[derive(Default)]
struct Born {
    /// Instance profile name → creation.
    profiles: HashMap<String, Instant>,
    /// Launch template ID and name → the instance profile its data names.
    templates: HashMap<String, String>,
    /// EC2 ID → when a create's reply first showed it.
    ids: HashMap<String, Instant>,
    /// Cluster tag key → the last CreateAutoScalingGroup carrying it.
    groups: HashMap<String, Instant>,
    /// S3 bucket → its region (from CreateBucket's LocationConstraint; us-east-1 without).
    buckets: HashMap<String, String>,
}

/// AWS as it really behaves, where moto is instantly consistent and lax, injected by content
/// and seeded windows (on by default in the AWS lab and the cloud lab):
/// - an instance profile cannot be used for a while after CreateInstanceProfile: Auto Scaling
///   refuses groups whose launch template names it with AWS's `Invalid IAM Instance Profile
///   name`, and IAM itself answers `NoSuchEntity` at first;
/// - an ID an EC2 create just returned answers `*.NotFound` to writes naming it (not to
///   deletes, and not to launch templates, which AWS does not check);
/// - a new Auto Scaling group's instances are not there yet: DescribeInstances of its cluster
///   shows none for a moment;
/// - IAM name and tag lengths are enforced (role names 64, instance profile names 128, tag
///   keys 128, tag values 256);
/// - S3 answers a request signed for another region than the bucket's with a 301 and
///   `x-amz-bucket-region`;
/// - the default account's Elastic IP quota is 100 ([`RAISED_ADDRESS_QUOTA`]); an account of a
///   test's own keeps moto's (and AWS's default) 5.
#[derive(Clone)]
pub struct AsItIs {
    seed: u64,
    windows: Windows,
    born: Arc<Mutex<Born>>,
}

impl AsItIs {
    pub fn new(seed: u64) -> AsItIs {
        AsItIs {
            seed,
            windows: Windows::default(),
            born: Arc::new(Mutex::new(Born::default())),
        }
    }

    /// The seed the lab uses unless `KPROV_LAB_SEED` says otherwise (printed on failure by
    /// the tests that report it).
    pub fn lab_seed() -> u64 {
        std::env::var("KPROV_LAB_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(23)
    }

    /// Whether the lab runs with this policy: yes unless `KPROV_LAB_AS_IT_IS=0`.
    pub fn enabled() -> bool {
        std::env::var("KPROV_LAB_AS_IT_IS").map_or(true, |v| v != "0")
    }

    /// A window in `range` (milliseconds) fixed by the seed and `name`.
    fn window(&self, range: (u64, u64), name: &str) -> Duration {
        let mut h = Sha256::new();
        h.update(self.seed.to_le_bytes());
        h.update(name.as_bytes());
        let d = h.finalize();
        let x = u64::from_le_bytes(d[..8].try_into().unwrap_or_default());
        Duration::from_millis(range.0 + x % (range.1 - range.0 + 1))
    }

    /// Declares where a bucket made outside the proxy lives.
    pub fn bucket_region(&self, bucket: &str, region: &str) {
        self.born
            .lock()
            .expect("born")
            .buckets
            .insert(bucket.into(), region.into());
    }

    pub fn observer(&self) -> Observer {
        let me = self.clone();
        Box::new(move |r: &Request, reply: &[u8]| {
            let ok = reply.starts_with(b"HTTP/1.1 2") || reply.starts_with(b"HTTP/1.0 2");
            if !ok {
                return;
            }
            let text = String::from_utf8_lossy(reply);
            let mut born = me.born.lock().expect("born");
            let now = Instant::now();
            match (r.service.as_str(), r.action.as_str()) {
                ("iam", "CreateInstanceProfile") => {
                    if let Some((_, n)) = params(r)
                        .into_iter()
                        .find(|(k, _)| k == "InstanceProfileName")
                    {
                        born.profiles.insert(n, now);
                    }
                }
                ("ec2", "CreateLaunchTemplate" | "CreateLaunchTemplateVersion") => {
                    let ps = params(r);
                    let get = |key: &str| ps.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
                    if let Some(profile) = get("LaunchTemplateData.IamInstanceProfile.Name") {
                        for key in [get("LaunchTemplateName"), get("LaunchTemplateId")]
                            .into_iter()
                            .flatten()
                        {
                            born.templates.insert(key, profile.clone());
                        }
                        if let Some(id) = tokens(&text).find(|t| t.starts_with("lt-")) {
                            born.templates.insert(id.to_string(), profile);
                        }
                    }
                }
                ("ec2", a) if a.starts_with("Create") || a.starts_with("Allocate") => {
                    for t in tokens(&text) {
                        if ec2_id_code(t).is_some() {
                            born.ids.entry(t.to_string()).or_insert(now);
                        }
                    }
                }
                ("autoscaling", "CreateAutoScalingGroup") => {
                    for (_, v) in params(r).into_iter().filter(|(k, _)| k.ends_with(".Key")) {
                        if v.starts_with("kubernetes.io/cluster/") {
                            born.groups.insert(v, now);
                        }
                    }
                }
                _ => {}
            }
        })
    }

    pub fn policy(&self) -> Policy {
        let me = self.clone();
        Box::new(move |r: &Request| me.decide(r))
    }

    fn decide(&self, r: &Request) -> Option<Fault> {
        if let Some(f) = length_limits(r) {
            return Some(f);
        }
        let mut born = self.born.lock().expect("born");
        let w = self.windows;
        let young =
            |at: Option<&Instant>, window: Duration| at.is_some_and(|t| t.elapsed() < window);
        match (r.service.as_str(), r.action.as_str()) {
            ("s3", _) => {
                let bucket = r
                    .path
                    .trim_start_matches('/')
                    .split(['/', '?'])
                    .next()
                    .unwrap_or_default();
                if bucket.is_empty() {
                    return None;
                }
                let path = r.path.split('?').next().unwrap_or_default();
                let only_bucket = !path.trim_matches('/').contains('/');
                let query = r.path.split_once('?').map(|(_, q)| q).unwrap_or_default();
                let create = query.is_empty() || query.starts_with("x-id=CreateBucket");
                if r.method == "PUT" && only_bucket && create {
                    let region = r
                        .body
                        .split("<LocationConstraint>")
                        .nth(1)
                        .and_then(|x| x.split('<').next())
                        .filter(|x| !x.is_empty())
                        .unwrap_or("us-east-1");
                    born.buckets.insert(bucket.to_string(), region.to_string());
                    return None;
                }
                // GetBucketLocation answers from any region, as on AWS.
                if r.path.ends_with("?location") || r.path.contains("?location&") {
                    return None;
                }
                match born.buckets.get(bucket) {
                    Some(region) if !r.region.is_empty() && *region != r.region => Some(
                        Fault::WrongRegion(Box::leak(region.clone().into_boxed_str())),
                    ),
                    _ => None,
                }
            }
            ("iam", "GetInstanceProfile" | "AddRoleToInstanceProfile") => {
                let name = params(r)
                    .into_iter()
                    .find(|(k, _)| k == "InstanceProfileName")?
                    .1;
                let window = self.window(w.profile, &name) / 2;
                young(born.profiles.get(&name), window)
                    .then_some(Fault::Answer(AwsError::NO_SUCH_ENTITY))
            }
            ("autoscaling", "CreateAutoScalingGroup" | "UpdateAutoScalingGroup") => {
                let ps = params(r);
                let template = ps.iter().find(|(k, _)| {
                    k == "LaunchTemplate.LaunchTemplateId"
                        || k == "LaunchTemplate.LaunchTemplateName"
                })?;
                let profile = born.templates.get(&template.1)?;
                let window = self.window(w.profile, profile);
                young(born.profiles.get(profile), window)
                    .then_some(Fault::Answer(AwsError::PROFILE_NOT_PROPAGATED))
            }
            // The suite's tests share the default account: its quota is raised (see the reply).
            ("ec2", "DescribeAccountAttributes") if r.account.is_empty() => {
                Some(Fault::Reply(RAISED_ADDRESS_QUOTA))
            }
            ("ec2", "DescribeInstances") => {
                let key = params(r)
                    .into_iter()
                    .find(|(k, v)| {
                        k.starts_with("Filter.") && v.starts_with("tag:kubernetes.io/cluster/")
                    })?
                    .1;
                let key = key.strip_prefix("tag:")?.to_string();
                let window = self.window(w.launch, &key);
                young(born.groups.get(&key), window).then_some(Fault::Reply(NO_INSTANCES))
            }
            ("ec2", a)
                if r.is_write()
                    && ![
                        "Delete",
                        "Release",
                        "Disassociate",
                        "Detach",
                        "Revoke",
                        "Terminate",
                        "CreateLaunchTemplate",
                        "CreateTags",
                    ]
                    .iter()
                    .any(|p| a.starts_with(p)) =>
            {
                let ps = params(r);
                ps.iter().flat_map(|(_, v)| tokens(v)).find_map(|t| {
                    let code = ec2_id_code(t)?;
                    young(born.ids.get(t), self.window(w.id, t)).then(|| {
                        Fault::Answer(AwsError {
                            status: 400,
                            code,
                            message: Box::leak(
                                format!("The ID '{t}' does not exist").into_boxed_str(),
                            ),
                        })
                    })
                })
            }
            _ => None,
        }
    }
}

/// AWS's length limits moto does not enforce: IAM role names (64), instance profile names
/// (128), tag keys (128) and values (256) on every service kprov tags through.
fn length_limits(r: &Request) -> Option<Fault> {
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    for (k, v) in params(r) {
        let limit = match (r.service.as_str(), r.action.as_str(), k.as_str()) {
            ("iam", "CreateRole", "RoleName") => Some((64, "roleName")),
            ("iam", "CreateInstanceProfile", "InstanceProfileName") => {
                Some((128, "instanceProfileName"))
            }
            (_, _, k) if k.contains("Tag") && k.ends_with(".Key") => Some((128, "tag key")),
            (_, _, k) if k.contains("Tag") && k.ends_with(".Value") => Some((256, "tag value")),
            _ => None,
        };
        let Some((max, what)) = limit else { continue };
        if v.chars().count() <= max {
            continue;
        }
        let (code, message) = match r.service.as_str() {
            "ec2" => (
                "InvalidParameterValue",
                leak(format!(
                    "Value ({v}) for parameter {what} is invalid. Length must be at most {max} characters"
                )),
            ),
            _ => (
                "ValidationError",
                leak(format!(
                    "1 validation error detected: Value '{v}' at '{what}' failed to satisfy constraint: Member must have length less than or equal to {max}"
                )),
            ),
        };
        return Some(Fault::Answer(AwsError {
            status: 400,
            code,
            message,
        }));
    }
    None
}
