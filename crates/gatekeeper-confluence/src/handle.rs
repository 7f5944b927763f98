//! Content handles: the ids the agent holds, real (`200`) or provisional (`~1`).
//!
//! A provisional handle names content whose create is still pending. Once the create is
//! applied the driver maps it to the real id, and the handle keeps working: every read
//! and every later action resolves it first. A handle never changes its spelling; only
//! what it resolves to does.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A page or blog post, as the agent names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ContentHandle {
    /// Content that exists in the wiki, by its id.
    Real(u64),
    /// Content a pending create will make, by its provisional number (`~N`).
    Provisional(u64),
}

impl ContentHandle {
    /// Whether this is a provisional `~N` handle.
    pub fn is_provisional(self) -> bool {
        matches!(self, Self::Provisional(_))
    }

    /// The real id, if this handle is real.
    pub fn real(self) -> Option<u64> {
        match self {
            Self::Real(id) => Some(id),
            Self::Provisional(_) => None,
        }
    }
}

impl fmt::Display for ContentHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Real(id) => write!(f, "{id}"),
            Self::Provisional(n) => write!(f, "~{n}"),
        }
    }
}

/// Text that is neither a numeric id nor a `~N` handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a content id; use a numeric id such as 200 or a provisional handle such as ~1"
)]
pub struct ParseHandleError(pub String);

impl FromStr for ContentHandle {
    type Err = ParseHandleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let (provisional, digits) = match trimmed.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, trimmed),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseHandleError(text.to_owned()));
        }
        let n: u64 = digits
            .parse()
            .map_err(|_| ParseHandleError(text.to_owned()))?;
        Ok(if provisional {
            Self::Provisional(n)
        } else {
            Self::Real(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_print_and_parse_both_ways() {
        assert_eq!(
            "~2".parse::<ContentHandle>(),
            Ok(ContentHandle::Provisional(2))
        );
        assert_eq!("201".parse::<ContentHandle>(), Ok(ContentHandle::Real(201)));
        assert_eq!(ContentHandle::Provisional(7).to_string(), "~7");
        assert!("~".parse::<ContentHandle>().is_err());
        assert!("12a".parse::<ContentHandle>().is_err());
        assert!("-1".parse::<ContentHandle>().is_err());
    }
}
