//! Ranking tools for a text query, for progressive discovery: BM25 (k1 1.2,
//! b 0.75) over each tool's words: its name (counted three times), the
//! names of its input's properties (twice), its description and its
//! properties' descriptions (once). Words are lowercase runs of letters or
//! digits, camelCase and snake_case split, a plural `s` dropped.
//! Deterministic: equal scores keep the catalog's order. No network, no
//! model: the index is built from the catalog's tools when first searched
//! after the catalog changed.

use std::collections::HashMap;

use serde_json::Value;

const K1: f32 = 1.2;
const B: f32 = 0.75;
/// How many times a word of each field counts.
const NAME_WEIGHT: u32 = 3;
const PROPERTY_WEIGHT: u32 = 2;
/// Words longer than this are cut (a hostile description's one long word).
const MAX_WORD: usize = 40;
/// Words of one tool indexed, at most (a hostile description's many).
const MAX_WORDS: usize = 2000;

/// The words of `text`, normalised.
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    let flush = |current: &mut String, out: &mut Vec<String>| {
        if !current.is_empty() {
            let mut word: String = current.chars().take(MAX_WORD).collect();
            if word.len() > 3 && word.ends_with('s') && !word.ends_with("ss") {
                word.pop();
            }
            out.push(word);
            current.clear();
        }
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            // camelCase: a capital after a lowercase letter starts a word.
            if c.is_uppercase() && previous_lower {
                flush(&mut current, &mut out);
            }
            previous_lower = c.is_lowercase() || c.is_ascii_digit();
            current.extend(c.to_lowercase());
        } else {
            previous_lower = false;
            flush(&mut current, &mut out);
        }
    }
    flush(&mut current, &mut out);
    out
}

/// The words of one tool (a `tools/list` item), weighted by field.
pub fn tool_words(name: &str, tool: &Value) -> Vec<String> {
    let mut all = Vec::new();
    for _ in 0..NAME_WEIGHT {
        all.extend(words(name));
    }
    if let Some(properties) = tool.pointer("/inputSchema/properties").and_then(Value::as_object) {
        for (property, schema) in properties {
            for _ in 0..PROPERTY_WEIGHT {
                all.extend(words(property));
            }
            if let Some(text) = schema.get("description").and_then(Value::as_str) {
                all.extend(words(text));
            }
        }
    }
    if let Some(text) = tool.get("description").and_then(Value::as_str) {
        all.extend(words(text));
    }
    all.truncate(MAX_WORDS);
    all
}

/// An inverted index of documents' words.
#[derive(Debug, Default)]
pub struct Index {
    /// Per word: (document, occurrences).
    postings: HashMap<String, Vec<(u32, u32)>>,
    lengths: Vec<u32>,
    average: f32,
}

impl Index {
    /// An index of `documents` (each one's words), numbered in order.
    pub fn build(documents: impl IntoIterator<Item = Vec<String>>) -> Index {
        let mut index = Index::default();
        for (doc, words) in documents.into_iter().enumerate() {
            let doc = doc as u32;
            index.lengths.push(words.len() as u32);
            let mut counts: HashMap<String, u32> = HashMap::new();
            for word in words {
                *counts.entry(word).or_default() += 1;
            }
            for (word, n) in counts {
                index.postings.entry(word).or_default().push((doc, n));
            }
        }
        let total: u64 = index.lengths.iter().map(|&l| u64::from(l)).sum();
        index.average = if index.lengths.is_empty() { 0.0 } else { total as f32 / index.lengths.len() as f32 };
        index
    }

    /// Documents indexed.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// The best `limit` documents for `query` among those `allowed`, best
    /// first, with their scores; none for a query without a known word.
    pub fn search(&self, query: &str, limit: usize, allowed: impl Fn(usize) -> bool) -> Vec<(usize, f32)> {
        let mut terms = words(query);
        terms.sort();
        terms.dedup();
        let n = self.lengths.len() as f32;
        // Dense: a score per document (a few tens of KiB for 10,000 tools),
        // cheaper than hashing each posting.
        let mut scores = vec![0f32; self.lengths.len()];
        let average = self.average.max(1.0);
        for term in &terms {
            let Some(postings) = self.postings.get(term) else { continue };
            let idf = (1.0 + (n - postings.len() as f32 + 0.5) / (postings.len() as f32 + 0.5)).ln();
            for &(doc, tf) in postings {
                let tf = tf as f32;
                let norm = 1.0 - B + B * self.lengths[doc as usize] as f32 / average;
                scores[doc as usize] += idf * tf * (K1 + 1.0) / (tf + K1 * norm);
            }
        }
        let mut ranked: Vec<(usize, f32)> =
            scores.into_iter().enumerate().filter(|&(d, s)| s > 0.0 && allowed(d)).collect();
        let by_score = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if ranked.len() > limit {
            ranked.select_nth_unstable_by(limit, by_score);
            ranked.truncate(limit);
        }
        ranked.sort_by(by_score);
        ranked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn words_split_cases_and_drop_plurals() {
        assert_eq!(words("getCurrentTime"), ["get", "current", "time"]);
        assert_eq!(words("create_file-now"), ["create", "file", "now"]);
        assert_eq!(words("Adds two numbers."), ["add", "two", "number"]);
        assert_eq!(words("HTTPServer class"), ["httpserver", "class"]);
        assert_eq!(words(""), Vec::<String>::new());
    }

    #[test]
    fn the_tool_that_fits_the_query_ranks_first_and_only_allowed_ones_come_back() {
        let tools = [
            ("web__echo", json!({"description": "Returns its arguments as JSON text."})),
            (
                "web__add",
                json!({"description": "Adds two numbers.", "inputSchema": {"properties": {"a": {}, "b": {}}}}),
            ),
            (
                "gh__create_issue",
                json!({"description": "Opens an issue in a repository.",
                "inputSchema": {"properties": {"title": {"description": "The issue's title"}, "repository": {}}}}),
            ),
            ("gh__list_issues", json!({"description": "Lists the issues of a repository."})),
        ];
        let index = Index::build(tools.iter().map(|(name, tool)| tool_words(name, tool)));
        assert_eq!(index.len(), 4);
        let first = |query: &str| index.search(query, 10, |_| true).first().map(|&(d, _)| tools[d].0);
        assert_eq!(first("add two numbers"), Some("web__add"));
        assert_eq!(first("open a new issue with a title"), Some("gh__create_issue"));
        assert_eq!(first("list issues"), Some("gh__list_issues"));
        assert_eq!(first("zebra"), None);
        // Filtered: the best one the caller may use.
        let only_lists = index.search("create issue", 10, |d| d == 3);
        assert_eq!(only_lists.iter().map(|&(d, _)| d).collect::<Vec<_>>(), [3]);
        // Deterministic, and bounded by the limit.
        assert_eq!(index.search("issue", 1, |_| true).len(), 1);
        assert_eq!(index.search("issue repository", 10, |_| true), index.search("repository issue", 10, |_| true));
    }
}
