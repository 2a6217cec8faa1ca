//! Python literals, as Ansible's INI inventory parser reads values (`ast.literal_eval`).
//!
//! Ansible passes every INI value through `ast.literal_eval` and keeps the text when that
//! fails, so `'ubuntu'` is `ubuntu`, `22` is a number and `{'a': 'b'}` is a dict. Only the
//! literal forms inventories use are read: strings (both quotes, adjacent ones concatenated),
//! integers, floats, `True`/`False`/`None`, lists, tuples and dicts. Anything else (sets,
//! bytes, complex numbers, expressions) is "not a literal" and the caller keeps the text, as
//! Ansible does. Nesting is bounded so a hostile value cannot exhaust the stack.

use serde_json::{Map, Number, Value};

const MAX_DEPTH: usize = 32;

/// The value of `text` as a Python literal, or `None` when it is not one.
pub(crate) fn parse(text: &str) -> Option<Value> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        i: 0,
    };
    let v = p.value(0)?;
    p.skip_ws();
    (p.i == p.s.len()).then_some(v)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while let Some(&c) = self.s.get(self.i) {
            if c == b'#' {
                // A comment runs to the end of the line, as in Python source.
                while self.s.get(self.i).is_some_and(|&c| c != b'\n') {
                    self.i += 1;
                }
            } else if c.is_ascii_whitespace() {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.skip_ws();
        match self.peek()? {
            b'\'' | b'"' => {
                let mut out = self.string()?;
                // Adjacent literals concatenate: 'a' "b" is "ab".
                loop {
                    self.skip_ws();
                    match self.peek() {
                        Some(b'\'' | b'"') => out.push_str(&self.string()?),
                        _ => break,
                    }
                }
                Some(Value::String(out))
            }
            b'[' => {
                self.i += 1;
                self.items(b']', depth).map(Value::Array)
            }
            b'(' => {
                self.i += 1;
                self.items(b')', depth).map(Value::Array)
            }
            b'{' => {
                self.i += 1;
                self.dict(depth)
            }
            _ => self.atom(),
        }
    }

    fn items(&mut self, close: u8, depth: usize) -> Option<Vec<Value>> {
        let mut out = Vec::new();
        loop {
            if self.eat(close) {
                return Some(out);
            }
            out.push(self.value(depth + 1)?);
            if !self.eat(b',') {
                return self.eat(close).then_some(out);
            }
        }
    }

    fn dict(&mut self, depth: usize) -> Option<Value> {
        let mut out = Map::new();
        loop {
            if self.eat(b'}') {
                return Some(Value::Object(out));
            }
            let key = match self.value(depth + 1)? {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => if b { "True" } else { "False" }.to_string(),
                _ => return None,
            };
            if !self.eat(b':') {
                return None;
            }
            let v = self.value(depth + 1)?;
            out.insert(key, v);
            if !self.eat(b',') {
                return self.eat(b'}').then_some(Value::Object(out));
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        let q = self.peek()?;
        let triple = self.s[self.i..].starts_with(&[q, q, q]);
        self.i += if triple { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let rest = self.text.get(self.i..)?;
            let c = rest.chars().next()?;
            if triple && rest.as_bytes().starts_with(&[q, q, q]) {
                self.i += 3;
                return Some(out);
            }
            if !triple && c as u32 == q as u32 {
                self.i += 1;
                return Some(out);
            }
            if !triple && c == '\n' {
                return None;
            }
            self.i += c.len_utf8();
            if c != '\\' {
                out.push(c);
                continue;
            }
            let e = self.text.get(self.i..)?.chars().next()?;
            self.i += e.len_utf8();
            match e {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '0' => out.push('\0'),
                '\\' | '\'' | '"' => out.push(e),
                '\n' => {}
                // Python keeps unknown escapes as written.
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
        }
    }

    fn atom(&mut self) -> Option<Value> {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-' | b'+'))
        {
            self.i += 1;
        }
        let word = self.text.get(start..self.i)?;
        match word {
            "True" => return Some(Value::Bool(true)),
            "False" => return Some(Value::Bool(false)),
            "None" => return Some(Value::Null),
            _ => {}
        }
        let digits = word.trim_start_matches(['-', '+']);
        if digits.is_empty() || !digits.as_bytes()[0].is_ascii_digit() {
            return None;
        }
        // Python forbids leading zeros on decimal integers (`010` is a syntax error).
        if digits.len() > 1 && digits.starts_with('0') && digits.bytes().all(|c| c.is_ascii_digit())
        {
            return None;
        }
        let clean = word.replace('_', "");
        if let Ok(n) = clean.parse::<i64>() {
            return Some(Value::Number(n.into()));
        }
        if clean.contains(['.', 'e', 'E'])
            && let Ok(f) = clean.parse::<f64>()
        {
            return Number::from_f64(f).map(Value::Number);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn literals_as_python_reads_them() {
        let cases: &[(&str, Option<Value>)] = &[
            ("'ubuntu'", Some(json!("ubuntu"))),
            ("\"ubuntu\"", Some(json!("ubuntu"))),
            ("'a' \"b\"", Some(json!("ab"))),
            ("'it\\'s'", Some(json!("it's"))),
            ("22", Some(json!(22))),
            ("-3", Some(json!(-3))),
            ("1.5", Some(json!(1.5))),
            ("True", Some(json!(true))),
            ("None", Some(Value::Null)),
            ("{'a': 'b', \"c\": 1}", Some(json!({"a": "b", "c": 1}))),
            ("[ \"158.160.110.213\" ]", Some(json!(["158.160.110.213"]))),
            ("('x', 'y',)", Some(json!(["x", "y"]))),
            (
                "{'k': ['v', {'n': None}]}",
                Some(json!({"k": ["v", {"n": null}]})),
            ),
            ("'ubuntu' # a comment", Some(json!("ubuntu"))),
            ("ubuntu", None),
            ("10.3.0.1", None),
            ("v1.29.3", None),
            ("true", None),
            ("010", None),
            ("'open", None),
            ("{a: b}", None),
            ("[1, 2", None),
            ("{{ lookup('env', 'X') }}", None),
        ];
        for (text, want) in cases {
            assert_eq!(&parse(text), want, "{text}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(parse(&deep), None);
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn quoted_strings_round_trip(s in "[a-zA-Z0-9 ._:/=-]{0,30}") {
            prop_assert_eq!(parse(&format!("'{s}'")), Some(Value::String(s.clone())));
            prop_assert_eq!(parse(&format!("\"{s}\"")), Some(Value::String(s)));
        }
    }
}
