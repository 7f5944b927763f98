//! Rules narrowed by arguments: whether a staged call's arguments pass a rule's tests
//! ([`kernel::ArgumentTest`]), with the reason for each verdict in words.
//!
//! The policy is deliberately small, so a person can read a rule and know what it lets
//! through. A test names one top-level argument and checks its value one way:
//!
//! - `is`: the value is exactly the text given (a number or boolean as JSON writes it);
//! - `under`: the value is a path at or below the one given, compared component by
//!   component (`/tmp/a` covers `/tmp/a` and `/tmp/a/b`, never `/tmp/ab`); a path with a
//!   `..` component, or a relative path against an absolute one, is never under anything;
//! - `at most`: a number no greater than the limit, or a text of at most that many bytes
//!   (a file's content, a message's body).
//!
//! Every test of a rule must pass. A missing argument, or a value of the wrong type,
//! passes nothing: a rule fails closed.

use kernel::{ArgumentCheck, ArgumentTest};
use serde_json::Value;

/// The verdict of one test on one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestVerdict {
    /// The test, as [`ArgumentTest`]'s display shows it.
    pub test: String,
    /// Whether it passed.
    pub passed: bool,
    /// Why, in words (what the value was).
    pub because: String,
}

/// Whether `args` (a call's arguments, a JSON object) pass every test.
pub fn passes(args: &Value, tests: &[ArgumentTest]) -> bool {
    tests.iter().all(|test| verdict(args, test).passed)
}

/// Each test's verdict on `args`, in order.
pub fn verdicts(args: &Value, tests: &[ArgumentTest]) -> Vec<TestVerdict> {
    tests.iter().map(|test| verdict(args, test)).collect()
}

fn verdict(args: &Value, test: &ArgumentTest) -> TestVerdict {
    let (passed, because) = match args.get(&test.argument) {
        None => (false, format!("the call has no argument {}", test.argument)),
        Some(value) => check(value, &test.check),
    };
    TestVerdict {
        test: test.to_string(),
        passed,
        because,
    }
}

fn check(value: &Value, check: &ArgumentCheck) -> (bool, String) {
    match (check, value) {
        (ArgumentCheck::Is(expected), value) => {
            let text = scalar_text(value);
            match text {
                Some(text) => (text == *expected, format!("it is {text:?}")),
                None => (false, "it is not a text, number or boolean".to_owned()),
            }
        }
        (ArgumentCheck::Under(root), Value::String(path)) => {
            let climbs = path.split('/').any(|part| part == "..");
            let because = if climbs {
                format!("it is {path:?}, and a path that climbs with .. is under nothing")
            } else {
                format!("it is {path:?}")
            };
            (is_under(path, root), because)
        }
        (ArgumentCheck::Under(_), _) => (false, "it is not a path".to_owned()),
        (ArgumentCheck::AtMost(limit), Value::Number(number)) => match number.as_f64() {
            Some(n) => (n <= *limit as f64, format!("it is {number}")),
            None => (false, format!("it is {number}")),
        },
        (ArgumentCheck::AtMost(limit), Value::String(text)) => (
            text.len() as u64 <= *limit,
            format!("it is {} bytes long", text.len()),
        ),
        (ArgumentCheck::AtMost(_), _) => (false, "it is neither a number nor a text".to_owned()),
    }
}

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// Whether `path` is `root` or below it, component by component.
pub fn is_under(path: &str, root: &str) -> bool {
    let components = |p: &str| -> Option<(bool, Vec<String>)> {
        let absolute = p.starts_with('/');
        let mut parts = Vec::new();
        for part in p.split('/') {
            match part {
                "" | "." => {}
                ".." => return None,
                part => parts.push(part.to_owned()),
            }
        }
        Some((absolute, parts))
    };
    match (components(path), components(root)) {
        (Some((path_abs, path)), Some((root_abs, root))) => {
            path_abs == root_abs && path.len() >= root.len() && path[..root.len()] == root[..]
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn test(argument: &str, check: ArgumentCheck) -> ArgumentTest {
        ArgumentTest {
            argument: argument.to_owned(),
            check,
        }
    }

    #[test]
    fn under_compares_whole_components() {
        assert!(is_under("/tmp/a", "/tmp/a"));
        assert!(is_under("/tmp/a/b.txt", "/tmp/a/"));
        assert!(is_under("/tmp//a/./b", "/tmp/a"));
        assert!(!is_under("/tmp/ab", "/tmp/a"));
        assert!(!is_under("/tmp/a/../etc/passwd", "/tmp/a"));
        assert!(!is_under("tmp/a/b", "/tmp/a"));
        assert!(!is_under("/tmp", "/tmp/a"));
    }

    #[test]
    fn every_test_must_pass_and_a_missing_argument_passes_nothing() {
        let tests = [
            test("path", ArgumentCheck::Under("/tmp/a".into())),
            test("content", ArgumentCheck::AtMost(5)),
        ];
        assert!(passes(
            &json!({"path": "/tmp/a/x", "content": "hello"}),
            &tests
        ));
        assert!(!passes(
            &json!({"path": "/tmp/a/x", "content": "hello!"}),
            &tests
        ));
        assert!(!passes(
            &json!({"path": "/tmp/b/x", "content": "hi"}),
            &tests
        ));
        assert!(!passes(&json!({"content": "hi"}), &tests));
        assert!(!passes(&json!({"path": 3, "content": "hi"}), &tests));
        assert!(passes(&json!({}), &[]));
    }

    #[test]
    fn is_compares_numbers_and_booleans_as_json_writes_them() {
        let tests = [
            test("count", ArgumentCheck::Is("3".into())),
            test("dry", ArgumentCheck::Is("true".into())),
        ];
        assert!(passes(&json!({"count": 3, "dry": true}), &tests));
        assert!(!passes(&json!({"count": 4, "dry": true}), &tests));
        assert!(!passes(&json!({"count": [3], "dry": true}), &tests));
        assert!(passes(
            &json!({"size": 10}),
            &[test("size", ArgumentCheck::AtMost(10))]
        ));
        assert!(!passes(
            &json!({"size": 10.5}),
            &[test("size", ArgumentCheck::AtMost(10))]
        ));
    }

    #[test]
    fn verdicts_say_why() {
        let tests = [test("path", ArgumentCheck::Under("/tmp/a".into()))];
        let verdict = &verdicts(&json!({"path": "/etc/x"}), &tests)[0];
        assert!(!verdict.passed);
        assert_eq!(verdict.test, "path is under /tmp/a");
        assert_eq!(verdict.because, "it is \"/etc/x\"");
        let missing = &verdicts(&json!({}), &tests)[0];
        assert_eq!(missing.because, "the call has no argument path");
    }
}
