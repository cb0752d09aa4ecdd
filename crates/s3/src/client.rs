//! A small S3 client: the handful of requests the store makes (GET with a range, PUT with a
//! condition, DELETE, LIST, bucket creation), SigV4-signed by `rusty-s3`, sent by `ureq` over
//! kept-alive connections, each retried with capped exponential backoff and jitter on what
//! may pass (a connection refused or cut, a timeout, 500, 502, 503, 504, 429), never on what
//! will not (403, 404, 412, other 4xx).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

use crate::config::Resolved;
use crate::S3Error;

/// How long a signed URL is valid: longer than any one attempt may take.
const SIGNED_FOR: Duration = Duration::from_secs(15 * 60);

/// Retries and timeouts.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Attempts of one request, the first included.
    pub attempts: u32,
    /// The first backoff; it doubles each retry, up to `max_backoff`, and is then jittered.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// For connecting, and for the first byte of a response.
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            attempts: 8,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
        }
    }
}

/// A PUT's condition (S3 conditional writes).
#[derive(Clone, Copy, Debug)]
pub enum Cond<'a> {
    /// Whatever is there.
    None,
    /// Only if nothing is there (`If-None-Match: *`).
    Absent,
    /// Only if what is there has this ETag (`If-Match`).
    Etag(&'a str),
}

/// What a conditional PUT did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Put {
    /// Written; the new ETag (when the server sent one).
    Done(Option<String>),
    /// The condition did not hold (412, or 409 for a concurrent conditional write).
    Refused,
}

/// An object's bytes and ETag.
#[derive(Clone, Debug)]
pub struct Tagged {
    pub body: Vec<u8>,
    pub etag: Option<String>,
}

/// One listed key.
#[derive(Clone, Debug)]
pub struct Listed {
    pub key: String,
    pub size: u64,
}

pub struct Client {
    agent: ureq::Agent,
    bucket: Bucket,
    creds: Credentials,
    opts: ClientOptions,
    /// Requests retried, for reports and tests.
    retries: AtomicU64,
    jitter: AtomicU64,
}

type Response = ureq::http::Response<ureq::Body>;

impl Client {
    pub fn new(r: &Resolved, bucket: &str, opts: ClientOptions) -> Result<Client, S3Error> {
        let endpoint = r
            .endpoint
            .parse()
            .map_err(|e| S3Error::Config(format!("endpoint {}: {e}", r.endpoint)))?;
        let style = if r.path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(endpoint, style, bucket.to_string(), r.region.clone())
            .map_err(|e| S3Error::Config(format!("bucket {bucket}: {e}")))?;
        let creds = match &r.token {
            Some(t) => Credentials::new_with_token(&r.access_key, &r.secret_key, t),
            None => Credentials::new(&r.access_key, &r.secret_key),
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(opts.timeout))
            .timeout_recv_response(Some(opts.timeout))
            .timeout_recv_body(Some(opts.timeout * 4))
            .timeout_send_body(Some(opts.timeout * 4))
            .max_idle_connections_per_host(32)
            .build()
            .into();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        Ok(Client {
            agent,
            bucket,
            creds,
            opts,
            retries: AtomicU64::new(0),
            jitter: AtomicU64::new(seed),
        })
    }

    pub fn bucket_name(&self) -> &str {
        self.bucket.name()
    }

    /// Requests retried so far.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Sends `make()`'s request until it gives an answer worth keeping.
    fn send(
        &self,
        op: &str,
        key: &str,
        make: impl Fn() -> Result<Response, ureq::Error>,
    ) -> Result<Response, S3Error> {
        let mut last = String::new();
        for attempt in 0..self.opts.attempts.max(1) {
            if attempt > 0 {
                self.retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(self.backoff(attempt));
            }
            match make() {
                Ok(r) if retryable(r.status().as_u16()) => {
                    last = format!("HTTP {}", r.status());
                    tracing::debug!("{op} {key}: {last}; retrying");
                }
                Ok(r) => return Ok(r),
                Err(e) => {
                    last = e.to_string();
                    tracing::debug!("{op} {key}: {last}; retrying");
                }
            }
        }
        Err(S3Error::Unavailable {
            op: format!("{op} {key}"),
            why: format!("{last} ({} attempts)", self.opts.attempts.max(1)),
        })
    }

    /// Full jitter over a capped exponential: a crowd of retrying clients spreads out.
    fn backoff(&self, attempt: u32) -> Duration {
        let cap = self
            .opts
            .backoff
            .saturating_mul(1 << attempt.min(16))
            .min(self.opts.max_backoff);
        // xorshift64: enough to spread retries, no crate needed.
        let mut x = self.jitter.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter.store(x, Ordering::Relaxed);
        let frac = (x >> 11) as f64 / (1u64 << 53) as f64;
        cap.mul_f64(0.5 + frac / 2.0)
    }

    /// The object `key`, or bytes `range` of it; `None` if there is no such object.
    pub fn get(&self, key: &str, range: Option<(u64, u64)>) -> Result<Option<Vec<u8>>, S3Error> {
        let r = self.send("GET", key, || {
            let url = self
                .bucket
                .get_object(Some(&self.creds), key)
                .sign(SIGNED_FOR);
            let mut req = self.agent.get(url.as_str());
            if let Some((a, b)) = range {
                req = req.header("range", format!("bytes={a}-{}", b - 1));
            }
            req.call()
        })?;
        let status = r.status().as_u16();
        if status == 404 {
            return self.absent(r, key);
        }
        let mut r = self.check(r, "GET", key)?;
        let body = read_body(&mut r, "GET", key)?;
        match range {
            Some((a, b)) if status == 200 => {
                // A server that ignores ranges sends the whole object.
                let (a, b) = (a as usize, b as usize);
                if body.len() < b {
                    return Err(S3Error::Damaged(format!(
                        "GET {key}: {} bytes, a range up to {b} was asked for",
                        body.len()
                    )));
                }
                Ok(Some(body[a..b].to_vec()))
            }
            Some((a, b)) if body.len() as u64 != b - a => Err(S3Error::Damaged(format!(
                "GET {key}: {} bytes for a range of {}",
                body.len(),
                b - a
            ))),
            _ => Ok(Some(body)),
        }
    }

    /// The last `n` bytes of `key` (all of it if shorter) and the object's whole size.
    pub fn get_tail(&self, key: &str, n: u64) -> Result<Option<(Vec<u8>, u64)>, S3Error> {
        let r = self.send("GET", key, || {
            let url = self
                .bucket
                .get_object(Some(&self.creds), key)
                .sign(SIGNED_FOR);
            self.agent
                .get(url.as_str())
                .header("range", format!("bytes=-{n}"))
                .call()
        })?;
        if r.status().as_u16() == 404 {
            return self.absent(r, key);
        }
        let status = r.status().as_u16();
        let mut r = self.check(r, "GET", key)?;
        let total = if status == 206 {
            r.headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit_once('/'))
                .and_then(|(_, t)| t.parse::<u64>().ok())
                .ok_or_else(|| {
                    S3Error::Damaged(format!("GET {key}: a range reply without its total size"))
                })?
        } else {
            0
        };
        let body = read_body(&mut r, "GET", key)?;
        let total = if status == 206 {
            total
        } else {
            body.len() as u64
        };
        let keep = (n as usize).min(body.len());
        Ok(Some((body[body.len() - keep..].to_vec(), total)))
    }

    pub fn put(&self, key: &str, body: &[u8], cond: Cond<'_>) -> Result<Put, S3Error> {
        let r = self.send("PUT", key, || {
            let url = self
                .bucket
                .put_object(Some(&self.creds), key)
                .sign(SIGNED_FOR);
            let mut req = self.agent.put(url.as_str());
            match cond {
                Cond::None => {}
                Cond::Absent => req = req.header("if-none-match", "*"),
                Cond::Etag(e) => req = req.header("if-match", e),
            }
            req.send(body)
        })?;
        match r.status().as_u16() {
            412 | 409 if !matches!(cond, Cond::None) => Ok(Put::Refused),
            // An If-Match on a key that is gone.
            404 if matches!(cond, Cond::Etag(_)) => Ok(Put::Refused),
            _ => {
                let r = self.check(r, "PUT", key)?;
                Ok(Put::Done(etag(&r)))
            }
        }
    }

    /// The object and its ETag (for a compare-and-swap with [`Cond::Etag`]).
    pub fn get_with_etag(&self, key: &str) -> Result<Option<Tagged>, S3Error> {
        let r = self.send("GET", key, || {
            let url = self
                .bucket
                .get_object(Some(&self.creds), key)
                .sign(SIGNED_FOR);
            self.agent.get(url.as_str()).call()
        })?;
        if r.status().as_u16() == 404 {
            return self.absent(r, key);
        }
        let mut r = self.check(r, "GET", key)?;
        let etag = etag(&r);
        Ok(Some(Tagged {
            body: read_body(&mut r, "GET", key)?,
            etag,
        }))
    }

    /// Deletes `key` (absent is no error: deletes are idempotent in S3).
    pub fn delete(&self, key: &str) -> Result<(), S3Error> {
        let r = self.send("DELETE", key, || {
            let url = self
                .bucket
                .delete_object(Some(&self.creds), key)
                .sign(SIGNED_FOR);
            self.agent.delete(url.as_str()).call()
        })?;
        if r.status().as_u16() != 404 {
            self.check(r, "DELETE", key)?;
        }
        Ok(())
    }

    /// Every key under `prefix`, a page of up to 1000 per request.
    pub fn list(&self, prefix: &str) -> Result<Vec<Listed>, S3Error> {
        self.list_after(prefix, None)
    }

    /// The keys under `prefix` that sort after `after` (all with `None`).
    pub fn list_after(&self, prefix: &str, after: Option<&str>) -> Result<Vec<Listed>, S3Error> {
        let mut out = vec![];
        let mut token: Option<String> = None;
        loop {
            let r = self.send("LIST", prefix, || {
                let mut a = self.bucket.list_objects_v2(Some(&self.creds));
                a.with_prefix(prefix);
                if let Some(t) = &token {
                    a.with_continuation_token(t.clone());
                } else if let Some(after) = after {
                    a.with_start_after(after);
                }
                self.agent.get(a.sign(SIGNED_FOR).as_str()).call()
            })?;
            let mut r = self.check(r, "LIST", prefix)?;
            let body = read_body(&mut r, "LIST", prefix)?;
            let text = String::from_utf8_lossy(&body);
            let page = rusty_s3::actions::ListObjectsV2::parse_response(&text).map_err(|e| {
                S3Error::Damaged(format!("LIST {prefix}: an unreadable listing: {e}"))
            })?;
            out.extend(page.contents.into_iter().map(|c| Listed {
                key: c.key,
                size: c.size.unwrap_or(0),
            }));
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(out),
            }
        }
    }

    /// Creates the bucket; one that exists already (and is ours) is no error.
    pub fn create_bucket(&self) -> Result<(), S3Error> {
        let name = self.bucket.name().to_string();
        let r = self.send("create bucket", &name, || {
            let url = self.bucket.create_bucket(&self.creds).sign(SIGNED_FOR);
            self.agent.put(url.as_str()).send_empty()
        })?;
        if r.status().as_u16() == 409 {
            return Ok(());
        }
        self.check(r, "create bucket", &name).map(|_| ())
    }

    /// A 404: no such key (`None`), or no such bucket (an error).
    fn absent<T>(&self, r: Response, key: &str) -> Result<Option<T>, S3Error> {
        match self.check(r, "GET", key) {
            Err(S3Error::NoBucket(b)) => Err(S3Error::NoBucket(b)),
            _ => Ok(None),
        }
    }

    /// Turns an error status into an error that says what went wrong in one line.
    fn check(&self, mut r: Response, op: &str, key: &str) -> Result<Response, S3Error> {
        let status = r.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(r);
        }
        let body = r
            .body_mut()
            .with_config()
            .limit(64 << 10)
            .read_to_vec()
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let code = xml_field(&text, "Code").unwrap_or_default();
        let msg = xml_field(&text, "Message").unwrap_or_default();
        let bucket = self.bucket.name();
        Err(match (status, code.as_str()) {
            (404, "NoSuchBucket") => S3Error::NoBucket(bucket.to_string()),
            (403, _) | (_, "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccessDenied") => {
                S3Error::Denied(format!(
                    "{op} {bucket}/{key}: {code} {msg} (check AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY, or the profile)"
                ))
            }
            _ => S3Error::Http {
                op: format!("{op} {bucket}/{key}"),
                status,
                why: format!("{code} {msg}").trim().to_string(),
            },
        })
    }
}

fn retryable(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

fn etag(r: &Response) -> Option<String> {
    r.headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The largest body the store reads at once: a pack (packs are a few MiB; a listing page is
/// well under this).
const MAX_BODY: u64 = 1 << 30;

fn read_body(r: &mut Response, op: &str, key: &str) -> Result<Vec<u8>, S3Error> {
    let expected = r
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = r
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_vec()
        .map_err(|e| S3Error::Unavailable {
            op: format!("{op} {key}"),
            why: format!("the reply was cut: {e}"),
        })?;
    if let Some(n) = expected {
        if body.len() as u64 != n {
            return Err(S3Error::Damaged(format!(
                "{op} {key}: {} bytes of a {n}-byte reply",
                body.len()
            )));
        }
    }
    Ok(body)
}

/// The text of `<name>…</name>` in an S3 error document.
fn xml_field(text: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = text.find(&open)? + open.len();
    let end = text[start..].find(&format!("</{name}>"))? + start;
    Some(text[start..end].to_string())
}
