//! The `seq` argument as an action's approval prompt shows it: how the crash worker and
//! the crash test tell which call a ledger entry is (included by both with `#[path]`).

/// The `seq` shown in an action's approval prompt, if it shows one.
pub fn seq_in_prompt(prompt: &str) -> Option<u64> {
    let at = prompt.find("\"seq\"")? + 5;
    prompt[at..]
        .trim_start_matches([':', ' '])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}
