//! `--store` URLs: `s3://bucket[/prefix]` or `file:///absolute/dir`. Parsed when the options are,
//! so that a bad URL stops `hypermnf serve` with a message before anything starts.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use object_store::path::Path as StorePath;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A local (or mounted) directory.
    Local(PathBuf),
    /// An S3 bucket, and the prefix under which every key is stored ("" for the bucket's root).
    S3 { bucket: String, prefix: String },
}

impl StoreUrl {
    pub fn parse(s: &str) -> Result<StoreUrl, String> {
        let bad = |why: &str| format!("{s:?} is not a store URL: {why} (expected s3://bucket/prefix or file:///absolute/dir)");
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket name"));
            }
            // S3's bucket naming rules, loosely: enough to catch a credential or a query pasted in.
            if !bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.') {
                return Err(bad("a bucket name has only lowercase letters, digits, '-' and '.'"));
            }
            let prefix = prefix.trim_matches('/');
            if prefix.contains(['?', '#']) || StorePath::parse(prefix).is_err() {
                return Err(bad("the prefix must be a plain path (no empty segments, '.', '..', '?' or '#')"));
            }
            return Ok(StoreUrl::S3 { bucket: bucket.to_string(), prefix: prefix.to_string() });
        }
        if let Some(rest) = s.strip_prefix("file://") {
            // file:///dir or file://localhost/dir; another host cannot be reached as a directory.
            let path = rest.strip_prefix("localhost").unwrap_or(rest);
            if !path.starts_with('/') {
                return Err(bad("a file URL needs an absolute path, as in file:///srv/hypermnf"));
            }
            let decoded = percent_encoding::percent_decode_str(path)
                .decode_utf8()
                .map_err(|_| bad("the path is not UTF-8 once percent-decoded"))?;
            return Ok(StoreUrl::Local(PathBuf::from(decoded.as_ref())));
        }
        match s.split_once("://") {
            Some((scheme, _)) => Err(bad(&format!("unsupported scheme {scheme:?}"))),
            None => Err(bad("no scheme")),
        }
    }
}

impl FromStr for StoreUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<StoreUrl, String> {
        StoreUrl::parse(s)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Local(p) => write!(f, "file://{}", p.display()),
            StoreUrl::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            StoreUrl::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls() {
        let s3 = |b: &str, p: &str| StoreUrl::S3 { bucket: b.into(), prefix: p.into() };
        assert_eq!(StoreUrl::parse("s3://cubes").unwrap(), s3("cubes", ""));
        assert_eq!(StoreUrl::parse("s3://cubes/").unwrap(), s3("cubes", ""));
        assert_eq!(StoreUrl::parse("s3://cubes/team-a/hypermnf/").unwrap(), s3("cubes", "team-a/hypermnf"));
        assert_eq!(StoreUrl::parse("s3://cubes/a/b").unwrap().to_string(), "s3://cubes/a/b");
        for bad in ["s3://", "s3:///prefix", "s3://Cubes", "s3://key:secret@cubes", "s3://cubes/a//b", "s3://cubes/a/../b", "s3://cubes/a?x=1"] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn file_urls_and_others() {
        assert_eq!(StoreUrl::parse("file:///srv/data").unwrap(), StoreUrl::Local("/srv/data".into()));
        assert_eq!(StoreUrl::parse("file://localhost/srv/my%20data").unwrap(), StoreUrl::Local("/srv/my data".into()));
        let e = StoreUrl::parse("file://relative/dir").unwrap_err();
        assert!(e.contains("absolute path"), "{e}");
        let e = StoreUrl::parse("gs://bucket").unwrap_err();
        assert!(e.contains("unsupported scheme \"gs\""), "{e}");
        assert!(StoreUrl::parse("/srv/data").unwrap_err().contains("no scheme"));
    }
}
