//! A projection's `scope` (CONTRACT §1) as the harness reads it and shows it.
//!
//! Entry points: [`Scoped`] (a record's scope, parsed strictly as its tool's type and kept
//! as written) and [`Scope`] (a scope's entries in written order, shared: what snapshots
//! and results show, see [`super::bounded::Redactor::shared_scope`]).
//!
//! A scope is read once, into its entries: no JSON object map is built for it (its keys
//! are the few fixed fields of a tool), and the typed view is taken from those entries.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::bounded::object_len_bound;

/// A scope key: one of the tools' fixed field names (not copied), or another key.
type Key = Cow<'static, str>;

/// The field names of the three tools' scopes, which nearly every key is.
fn key_of(text: &str) -> Option<&'static str> {
    Some(match text {
        "query" => "query",
        "index" => "index",
        "top_k" => "top_k",
        "service" => "service",
        "from" => "from",
        "to" => "to",
        "limit" => "limit",
        "datasource" => "datasource",
        "statement" => "statement",
        "params" => "params",
        "max_rows" => "max_rows",
        _ => return None,
    })
}

/// `text` as a key: a field name is not kept as its own copy.
fn owned_key(text: String) -> Key {
    key_of(&text).map_or(Cow::Owned(text), Cow::Borrowed)
}

/// A scope's entries in written order. Cheap to clone (shared); compared as a JSON object
/// is (the same keys with equal values, in any order).
#[derive(Clone, Default)]
pub struct Scope(Arc<Vec<(Key, Value)>>);

impl Scope {
    /// The entries of a JSON object, in its order (anything else is the empty scope).
    pub fn of(value: Value) -> Scope {
        match value {
            Value::Object(entries) => Scope::from_entries(
                entries
                    .into_iter()
                    .map(|(key, value)| (owned_key(key), value))
                    .collect(),
            ),
            _ => Scope::default(),
        }
    }

    fn from_entries(entries: Vec<(Key, Value)>) -> Scope {
        Scope(Arc::new(entries))
    }

    /// The entries, in written order.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.0.iter().map(|(key, value)| (key.as_ref(), value))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `key` (the last one written, should a key be written twice).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The scope as a JSON object.
    pub fn to_value(&self) -> Value {
        Value::Object(
            self.entries()
                .map(|(key, value)| (key.to_string(), value.clone()))
                .collect::<Map<String, Value>>(),
        )
    }

    /// Whether both are the very same shared entries (not only equal ones).
    pub fn ptr_eq(a: &Scope, b: &Scope) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// At least the scope's JSON size, from lengths alone (see [`object_len_bound`]).
    pub fn json_len_bound(&self) -> usize {
        object_len_bound(self.entries())
    }
}

impl From<Value> for Scope {
    fn from(value: Value) -> Scope {
        Scope::of(value)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.entries()).finish()
    }
}

impl PartialEq for Scope {
    fn eq(&self, other: &Scope) -> bool {
        Scope::ptr_eq(self, other)
            || (self.len() == other.len()
                && self
                    .entries()
                    .all(|(key, value)| other.get(key) == Some(value)))
    }
}

impl PartialEq<Value> for Scope {
    fn eq(&self, other: &Value) -> bool {
        match other {
            Value::Object(entries) => {
                self.len() == entries.len()
                    && self
                        .entries()
                        .all(|(key, value)| entries.get(key) == Some(value))
            }
            _ => false,
        }
    }
}

impl std::ops::Index<&str> for Scope {
    type Output = Value;

    /// The value of `key`, or `null` when there is none (as indexing a JSON value gives).
    fn index(&self, key: &str) -> &Value {
        const NULL: Value = Value::Null;
        self.get(key).unwrap_or(&NULL)
    }
}

impl Serialize for Scope {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (key, value) in self.entries() {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Scope {
    /// A JSON object, its entries in order (every one, even a key written twice).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EntriesVisitor)
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Scope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a scope object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scope, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(6).min(16));
        while let Some(key) = map.next_key_seed(KeySeed)? {
            entries.push((key, map.next_value::<Value>()?));
        }
        Ok(Scope::from_entries(entries))
    }
}

/// Reads a key, not copying one of the tools' field names.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Key, E> {
        Ok(key_of(text).map_or_else(|| Cow::Owned(text.to_string()), Cow::Borrowed))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Key, E> {
        Ok(owned_key(text))
    }
}

/// A projection's `scope`: parsed strictly as `T`, and kept exactly as written (key order,
/// number forms) for what the harness shows. Only readable from a JSON object: its entries
/// once, then `T` from them (an unknown or repeated key, or a missing field, rejects it).
#[derive(Debug, Clone, PartialEq)]
pub struct Scoped<T> {
    pub typed: T,
    /// Shared: a scope that bounding leaves unchanged is shown as these very entries.
    pub raw: Scope,
}

impl<T> std::ops::Deref for Scoped<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.typed
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Scoped<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Scope::deserialize(d)?;
        let entries = raw.0.iter().map(|(key, value)| (key.as_ref(), value));
        let typed = T::deserialize(de::value::MapDeserializer::<_, serde_json::Error>::new(
            entries,
        ))
        .map_err(de::Error::custom)?;
        Ok(Scoped { typed, raw })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Typed {
        service: String,
        limit: u32,
        #[serde(default)]
        params: Option<Map<String, Value>>,
    }

    fn scoped(text: &str) -> Result<Scoped<Typed>, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_scope_keeps_its_entries_as_written_and_reads_them_typed() {
        let text =
            r#"{"limit": 5, "params": {"z": 1, "a": [1.50, -0, 1e2]}, "service": "o\u0041"}"#;
        let s = scoped(text).unwrap();
        assert_eq!(s.service, "oA");
        assert_eq!(s.limit, 5);
        let keys: Vec<_> = s.raw.entries().map(|(k, _)| k).collect();
        assert_eq!(keys, ["limit", "params", "service"]);
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            serde_json::to_string(&s.raw).unwrap(),
            serde_json::to_string(&value).unwrap(),
            "written order and number forms kept, as a JSON value keeps them"
        );
        assert_eq!(s.raw, value);
        assert_eq!(Scope::of(value.clone()), s.raw);
        assert_eq!(s.raw.to_value(), value);
        assert_eq!(s.raw["service"], "oA");
        assert_eq!(s.raw["absent"], Value::Null);
    }

    #[test]
    fn a_scope_that_is_not_its_tools_object_is_rejected() {
        for bad in [
            r#"{"service": "o"}"#,
            r#"{"service": "o", "limit": 5, "other": 1}"#,
            r#"{"service": "o", "limit": 5, "limit": 6}"#,
            r#"{"service": "o", "limit": -1}"#,
            r#"{"service": "o", "limit": 1.5}"#,
            r#"["o", 5]"#,
            r#""o""#,
            r#"{"service": "o", "limit": 5"#,
        ] {
            assert!(scoped(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scopes_compare_as_json_objects() {
        let a = Scope::of(json!({"service": "o", "limit": 5}));
        let reordered = Scope::of(json!({"limit": 5, "service": "o"}));
        let other = Scope::of(json!({"service": "o", "limit": 6}));
        let more = Scope::of(json!({"service": "o", "limit": 5, "x": null}));
        assert_eq!(a, reordered);
        assert_ne!(a, other);
        assert_ne!(a, more);
        assert_ne!(more, a);
        assert!(Scope::ptr_eq(&a, &a.clone()) && !Scope::ptr_eq(&a, &reordered));
        assert_ne!(a, json!(["o", 5]));
    }
}
