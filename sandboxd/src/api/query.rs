//! Query strings of the file routes: percent-decoded, each name at most once, unknown
//! names refused (as unknown JSON fields are), values checked where they are read.

use crate::error::{Error, Result};

/// A parsed query string.
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Parses `raw` (the part after `?`), allowing only `known` names.
    pub fn parse(raw: Option<&str>, known: &[&str]) -> Result<Query> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for part in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            let (k, v) = (decode(k)?, decode(v)?);
            if !known.contains(&k.as_str()) {
                return Err(Error::BadRequest(format!(
                    "unknown query parameter {k:?} (known: {})",
                    known.join(", ")
                )));
            }
            if pairs.iter().any(|(have, _)| *have == k) {
                return Err(Error::BadRequest(format!(
                    "query parameter {k:?} given twice"
                )));
            }
            pairs.push((k, v));
        }
        Ok(Query { pairs })
    }

    /// The value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A required value.
    pub fn require(&self, name: &str) -> Result<String> {
        match self.get(name) {
            Some(v) if !v.is_empty() => Ok(v.to_string()),
            _ => Err(Error::BadRequest(format!(
                "query parameter {name} is required"
            ))),
        }
    }

    /// `true`/`false`, default `false`.
    pub fn flag(&self, name: &str) -> Result<bool> {
        match self.get(name) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(v) => Err(Error::BadRequest(format!(
                "{name}={v:?} is not true or false"
            ))),
        }
    }

    /// A decimal number.
    pub fn number(&self, name: &str) -> Result<Option<u32>> {
        self.get(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| Error::BadRequest(format!("{name}={v:?} is not a number")))
            })
            .transpose()
    }

    /// Permission bits written in octal (`0644` or `644`).
    pub fn mode(&self) -> Result<Option<u32>> {
        self.get("mode")
            .map(|v| match u32::from_str_radix(v, 8) {
                Ok(m) if m <= 0o7777 && !v.is_empty() => Ok(m),
                _ => Err(Error::BadRequest(format!(
                    "mode={v:?} is not octal permission bits"
                ))),
            })
            .transpose()
    }
}

/// Percent-decoding (`+` is a space, as browsers send it); the result must be UTF-8.
pub(crate) fn decode(s: &str) -> Result<String> {
    let bad = || Error::BadRequest(format!("bad percent-encoding in {s:?}"));
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3).ok_or_else(bad)?;
                let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let q = Query::parse(
            Some("path=%2Fa%20b+c&mode=0640&recursive=true"),
            &["path", "mode", "recursive"],
        )
        .unwrap();
        assert_eq!(q.require("path").unwrap(), "/a b c");
        assert_eq!(q.mode().unwrap(), Some(0o640));
        assert!(q.flag("recursive").unwrap());
        for bad in ["x=1", "path=a&path=b", "path=%zz", "path=%ff", "path=%2"] {
            assert!(Query::parse(Some(bad), &["path"]).is_err(), "{bad}");
        }
        let q = Query::parse(Some("mode=9&recursive=maybe"), &["mode", "recursive"]).unwrap();
        assert!(q.mode().is_err() && q.flag("recursive").is_err());
        assert!(Query::parse(None, &["path"])
            .unwrap()
            .require("path")
            .is_err());
    }
}
