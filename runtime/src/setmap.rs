//! A map from a key to a set of object names — the small indexes the core, the kit and the
//! views keep from the watches (addresses by the claim they name, claims by namespace,
//! addresses by IP, …), spelled once. An emptied set is dropped, so the map never grows
//! with keys that were once used. Most keys have one name (a claim's address, an address's
//! IP): that name is held inline, not in a B-tree node of its own (~0.3 KiB per key at
//! 20,000 keys).

use std::borrow::Borrow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

#[derive(Debug)]
pub struct SetMap<K> {
    sets: HashMap<K, Names>,
}

/// The names under one key, in order; never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Names {
    One(String),
    Many(BTreeSet<String>),
}

impl Names {
    fn insert(&mut self, name: &str) {
        match self {
            Names::One(n) if n == name => {}
            Names::One(n) => {
                let set = BTreeSet::from([std::mem::take(n), name.to_string()]);
                *self = Names::Many(set);
            }
            Names::Many(set) => {
                set.insert(name.to_string());
            }
        }
    }

    /// Removes `name`; true when no name is left.
    fn remove(&mut self, name: &str) -> bool {
        match self {
            Names::One(n) => n == name,
            Names::Many(set) => {
                set.remove(name);
                if set.len() == 1
                    && let Some(last) = set.pop_first()
                {
                    *self = Names::One(last);
                    return false;
                }
                set.is_empty()
            }
        }
    }

    /// The names, in order.
    pub fn iter(&self) -> impl Iterator<Item = &String> {
        let (one, many) = match self {
            Names::One(n) => (Some(n), None),
            Names::Many(set) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    pub fn len(&self) -> usize {
        match self {
            Names::One(_) => 1,
            Names::Many(set) => set.len(),
        }
    }

    /// Never true for the names of a key in the map: an emptied set is dropped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, name: &str) -> bool {
        match self {
            Names::One(n) => n == name,
            Names::Many(set) => set.contains(name),
        }
    }

    fn into_vec(self) -> Vec<String> {
        match self {
            Names::One(n) => vec![n],
            Names::Many(set) => set.into_iter().collect(),
        }
    }
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
        match self.sets.entry(key) {
            Entry::Occupied(mut e) => e.get_mut().insert(name),
            Entry::Vacant(e) => {
                e.insert(Names::One(name.to_string()));
            }
        }
    }

    /// Removes `name` from the set of `key`, and the set once it is empty.
    pub fn remove<Q>(&mut self, key: &Q, name: &str)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(names) = self.sets.get_mut(key)
            && names.remove(name)
        {
            self.sets.remove(key);
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

    /// Takes the names of `key` out, in order.
    pub fn take<Q>(&mut self, key: &Q) -> Option<Vec<String>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.sets.remove(key).map(Names::into_vec)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&Names>
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
    fn one_name_is_held_inline_and_back_again_when_the_others_leave() {
        let mut m: SetMap<String> = SetMap::default();
        m.insert("k".into(), "b");
        m.insert("k".into(), "b");
        assert_eq!(m.get("k"), Some(&Names::One("b".into())));
        m.insert("k".into(), "a");
        m.insert("k".into(), "c");
        assert!(matches!(m.get("k"), Some(Names::Many(_))));
        assert_eq!(m.names("k"), ["a", "b", "c"]);
        let names = m.get("k").unwrap();
        assert!(names.contains("c") && !names.contains("d") && names.len() == 3);
        m.remove("k", "c");
        m.remove("k", "d");
        m.remove("k", "a");
        assert_eq!(m.get("k"), Some(&Names::One("b".into())));
        m.remove("k", "a");
        assert_eq!(
            m.names("k"),
            ["b"],
            "removing a name that is not there changes nothing"
        );
        m.remove("k", "b");
        assert!(!m.contains_key("k"));
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
