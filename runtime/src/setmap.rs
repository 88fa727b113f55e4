//! A map from a key to a set of object names — the small indexes the core, the kit and the
//! views keep from the watches (addresses by the claim they name, claims by namespace,
//! addresses by IP, …), spelled once. An emptied set is dropped, so the map never grows
//! with keys that were once used.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

#[derive(Debug)]
pub struct SetMap<K> {
    sets: HashMap<K, BTreeSet<String>>,
}

impl<K> Default for SetMap<K> {
    fn default() -> Self {
        SetMap {
            sets: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq> SetMap<K> {
    pub fn insert(&mut self, key: K, name: &str) {
        self.sets.entry(key).or_default().insert(name.to_string());
    }

    /// Removes `name` from the set of `key`, and the set once it is empty.
    pub fn remove<Q>(&mut self, key: &Q, name: &str)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(set) = self.sets.get_mut(key) {
            set.remove(name);
            if set.is_empty() {
                self.sets.remove(key);
            }
        }
    }

    /// An object's key changed from `old` to `new` (either absent): `name` leaves the one
    /// set and joins the other — how every index follows a watched change.
    pub fn moved(&mut self, name: &str, old: Option<K>, new: Option<K>) {
        if old == new {
            return;
        }
        if let Some(k) = old {
            self.remove(&k, name);
        }
        if let Some(k) = new {
            self.insert(k, name);
        }
    }

    /// Takes the whole set of `key` out.
    pub fn take<Q>(&mut self, key: &Q) -> Option<BTreeSet<String>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.sets.remove(key)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&BTreeSet<String>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.sets.get(key)
    }

    /// The names under `key`, in order (empty when none).
    pub fn names<Q>(&self, key: &Q) -> Vec<String>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.sets.contains_key(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.sets.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emptied_sets_are_dropped() {
        let mut m: SetMap<String> = SetMap::default();
        m.insert("t/a".into(), "x");
        m.insert("t/a".into(), "y");
        assert_eq!(m.names("t/a"), ["x", "y"]);
        m.remove("t/a", "x");
        assert!(m.contains_key("t/a"));
        m.remove("t/a", "y");
        assert!(!m.contains_key("t/a"));
        assert_eq!(m.keys().count(), 0);
        m.insert("c".into(), "z");
        assert_eq!(m.take("c").map(|s| s.len()), Some(1));
        assert!(m.names("c").is_empty());
    }

    #[test]
    fn a_moved_name_leaves_its_old_set_and_joins_the_new_one() {
        let mut m: SetMap<String> = SetMap::default();
        m.moved("x", None, Some("t/a".into()));
        m.moved("y", None, Some("t/a".into()));
        assert_eq!(m.names("t/a"), ["x", "y"]);
        // Unchanged: nothing moves.
        m.moved("x", Some("t/a".into()), Some("t/a".into()));
        assert_eq!(m.names("t/a"), ["x", "y"]);
        m.moved("x", Some("t/a".into()), Some("t/b".into()));
        assert_eq!(
            (m.names("t/a"), m.names("t/b")),
            (vec!["y".to_string()], vec!["x".to_string()])
        );
        // Gone: the emptied set goes too.
        m.moved("x", Some("t/b".into()), None);
        assert!(!m.contains_key("t/b"));
    }
}
