//! Where a store lives (`s3://BUCKET/PREFIX`) and how to reach it: endpoint, region and
//! credentials, taken the way the AWS tools take them.
//!
//! In order, the first that says wins:
//! - the locator's query: `s3://bucket/prefix?endpoint=http://127.0.0.1:7070&region=r&profile=p`;
//! - the environment: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, `AWS_REGION`,
//!   `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//!   `AWS_PROFILE`;
//! - the profile (`default` unless named) in `~/.aws/credentials` (`AWS_SHARED_CREDENTIALS_FILE`)
//!   and `~/.aws/config` (`AWS_CONFIG_FILE`, sections `[profile NAME]`): `aws_access_key_id`,
//!   `aws_secret_access_key`, `aws_session_token`, `region`, `endpoint_url`.
//!
//! Without an endpoint the store is AWS's (`https://s3.REGION.amazonaws.com`, virtual-hosted
//! addressing); with one (a self-hosted server) addressing is path-style.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::S3Error;

/// A parsed `s3://BUCKET[/PREFIX][?OPTIONS]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locator {
    pub bucket: String,
    /// Empty, or ends with `/`.
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub profile: Option<String>,
}

impl Locator {
    /// Whether `s` names an S3 store rather than a directory.
    pub fn is_s3(s: &str) -> bool {
        s.starts_with("s3://")
    }

    pub fn parse(s: &str) -> Result<Locator, S3Error> {
        let bad = |why: &str| S3Error::Config(format!("{s}: {why} (write s3://BUCKET/PREFIX)"));
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| bad("not an s3:// URL"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !bucket.starts_with(['-', '.'])
            && !bucket.ends_with(['-', '.']);
        if !bucket_ok {
            return Err(bad(
                "the bucket name must be 3 to 63 lower-case letters, digits, dots and dashes",
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..")
            || prefix.contains("//")
            || prefix.chars().any(|c| c.is_control())
        {
            return Err(bad("the prefix has an empty, `.` or `..` part"));
        }
        let mut l = Locator {
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            endpoint: None,
            region: None,
            profile: None,
        };
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad("an option without `=`"))?;
            let v = Some(v.to_string());
            match k {
                "endpoint" => l.endpoint = v,
                "region" => l.region = v,
                "profile" => l.profile = v,
                _ => {
                    return Err(bad(&format!(
                        "unknown option `{k}` (endpoint, region, profile)"
                    )))
                }
            }
        }
        Ok(l)
    }

    /// A short name for messages and for the local cache's directory: bucket and prefix, and
    /// the endpoint when one is given.
    pub fn display(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

/// Everything needed to sign and send requests.
#[derive(Clone)]
pub struct Resolved {
    pub endpoint: String,
    pub path_style: bool,
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
    pub token: Option<String>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// Where the environment comes from (the process's, or a test's).
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for HashMap<&str, &str> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).map(|s| s.to_string())
    }
}

/// Resolves endpoint, region and credentials for `l`.
pub fn resolve(l: &Locator, env: &dyn Env) -> Result<Resolved, S3Error> {
    let home = env.var("HOME").map(PathBuf::from);
    let file = |var: &str, rel: &str| {
        env.var(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(rel)))
    };
    let profile = l
        .profile
        .clone()
        .or_else(|| env.var("AWS_PROFILE"))
        .unwrap_or_else(|| "default".into());
    let creds = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials")
        .map(|p| read_ini(&p, &profile, false))
        .transpose()?
        .unwrap_or_default();
    let config = file("AWS_CONFIG_FILE", ".aws/config")
        .map(|p| read_ini(&p, &profile, true))
        .transpose()?
        .unwrap_or_default();
    let from_files = |k: &str| creds.get(k).or_else(|| config.get(k)).cloned();
    let region = l
        .region
        .clone()
        .or_else(|| env.var("AWS_REGION"))
        .or_else(|| env.var("AWS_DEFAULT_REGION"))
        .or_else(|| from_files("region"))
        .unwrap_or_else(|| "us-east-1".into());
    let endpoint = l
        .endpoint
        .clone()
        .or_else(|| env.var("AWS_ENDPOINT_URL_S3"))
        .or_else(|| env.var("AWS_ENDPOINT_URL"))
        .or_else(|| from_files("endpoint_url"));
    let path_style = endpoint.is_some();
    let endpoint = endpoint.unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(S3Error::Config(format!(
            "endpoint {endpoint}: write http://HOST[:PORT] or https://HOST[:PORT]"
        )));
    }
    let (access_key, secret_key, token) = match (
        env.var("AWS_ACCESS_KEY_ID"),
        env.var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Some(a), Some(s)) => (a, s, env.var("AWS_SESSION_TOKEN")),
        _ => match (
            from_files("aws_access_key_id"),
            from_files("aws_secret_access_key"),
        ) {
            (Some(a), Some(s)) => (a, s, from_files("aws_session_token")),
            _ => {
                return Err(S3Error::Config(format!(
                    "no credentials for {}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
                     give profile `{profile}` keys in ~/.aws/credentials",
                    l.display()
                )))
            }
        },
    };
    Ok(Resolved {
        endpoint: endpoint.trim_end_matches('/').to_string(),
        path_style,
        region,
        access_key,
        secret_key,
        token,
    })
}

/// The keys of one profile's section of an AWS INI file (`[NAME]` in credentials; `[profile
/// NAME]`, or `[default]`, in config). A missing file is an empty profile.
fn read_ini(
    path: &std::path::Path,
    profile: &str,
    config: bool,
) -> Result<HashMap<String, String>, S3Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => {
            return Err(S3Error::Config(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    Ok(parse_ini(&text, profile, config))
}

fn parse_ini(text: &str, profile: &str, config: bool) -> HashMap<String, String> {
    let want = if config && profile != "default" {
        format!("profile {profile}")
    } else {
        profile.to_string()
    };
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == want;
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locators() {
        let l = Locator::parse("s3://my-bucket/a/b/?endpoint=http://127.0.0.1:9000&region=garage")
            .unwrap();
        assert_eq!(l.bucket, "my-bucket");
        assert_eq!(l.prefix, "a/b/");
        assert_eq!(l.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(l.region.as_deref(), Some("garage"));
        assert_eq!(Locator::parse("s3://bkt").unwrap().prefix, "");
        for bad in [
            "s3://",
            "s3://UPPER/x",
            "s3://ab",
            "s3://bkt/../x",
            "s3://bkt/a//b",
            "s3://bkt/x?colour=red",
            "s3://bkt/x?endpoint",
            "/tmp/store",
        ] {
            assert!(Locator::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn profiles_and_precedence() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join(".aws")).unwrap();
        std::fs::write(
            t.path().join(".aws/credentials"),
            "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n\n\
             [other]\naws_access_key_id=AK2\naws_secret_access_key=SK2\naws_session_token=T\n",
        )
        .unwrap();
        std::fs::write(
            t.path().join(".aws/config"),
            "[default]\nregion = eu-west-1\n# comment\n[profile other]\nregion=garage\n\
             endpoint_url = http://127.0.0.1:3900\n",
        )
        .unwrap();
        let home = t.path().to_str().unwrap();
        let l = Locator::parse("s3://bkt/p").unwrap();
        let r = resolve(&l, &HashMap::from([("HOME", home)])).unwrap();
        assert_eq!((r.access_key.as_str(), r.secret_key.as_str()), ("AK", "SK"));
        assert_eq!(r.region, "eu-west-1");
        assert_eq!(r.endpoint, "https://s3.eu-west-1.amazonaws.com");
        assert!(!r.path_style);
        let r = resolve(
            &l,
            &HashMap::from([("HOME", home), ("AWS_PROFILE", "other")]),
        )
        .unwrap();
        assert_eq!(r.access_key, "AK2");
        assert_eq!(r.token.as_deref(), Some("T"));
        assert_eq!(
            (r.region.as_str(), r.endpoint.as_str()),
            ("garage", "http://127.0.0.1:3900")
        );
        assert!(r.path_style);
        // The environment beats the files; the locator beats the environment.
        let env = HashMap::from([
            ("HOME", home),
            ("AWS_ACCESS_KEY_ID", "EAK"),
            ("AWS_SECRET_ACCESS_KEY", "ESK"),
            ("AWS_ENDPOINT_URL", "http://env:1/"),
            ("AWS_REGION", "r1"),
        ]);
        let r = resolve(&l, &env).unwrap();
        assert_eq!(
            (r.access_key.as_str(), r.endpoint.as_str()),
            ("EAK", "http://env:1")
        );
        let l2 = Locator::parse("s3://bkt/p?endpoint=http://loc:2&region=r2").unwrap();
        let r = resolve(&l2, &env).unwrap();
        assert_eq!(
            (r.endpoint.as_str(), r.region.as_str()),
            ("http://loc:2", "r2")
        );
        // No credentials anywhere: one clear error.
        let e = resolve(&l, &HashMap::from([("HOME", "/nonexistent")])).unwrap_err();
        assert!(e.to_string().contains("AWS_ACCESS_KEY_ID"), "{e}");
    }
}
