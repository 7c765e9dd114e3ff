//! The server's store: a redb database in a file of its own under the temporary directory,
//! unlinked as soon as it is open, so that no end of the process leaves it behind.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{AccessGuard, Database, Durability, TableDefinition};

/// The one table: keys and values as bytes.
const TABLE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("kv");

/// redb's error, boxed: it is large, and rare.
pub type StoreError = Box<redb::Error>;

/// `error` as a [`StoreError`].
fn boxed(error: impl Into<redb::Error>) -> StoreError {
    Box::new(error.into())
}

/// A redb database in a temporary file.
///
/// Each PUT and DELETE is a transaction of its own, committed without an fsync
/// ([`Durability::None`]): the file is thrown away with the store, and the figures measure
/// the transport and the store's work, not the disk's flushes.
#[derive(Debug)]
pub struct Store {
    db: Database,
}

impl Store {
    /// A new, empty store in a file of its own under the temporary directory.
    ///
    /// # Errors
    ///
    /// redb's, when the file cannot be made or the table created.
    pub fn create_temporary() -> Result<Store, StoreError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        Store::create_unlinked(
            &std::env::temp_dir()
                .join(format!("tierbuf-kv-{}-{nanos:09}.redb", std::process::id())),
        )
    }

    /// A new, empty store in a file made at `path` and unlinked at once: the database
    /// keeps the file open, so its name is gone from the start and its space when the
    /// store is dropped, however the process ends (a server process exits without running
    /// destructors when its client goes).
    fn create_unlinked(path: &Path) -> Result<Store, StoreError> {
        let db = Database::create(path).map_err(boxed)?;
        let store = Store { db };
        std::fs::remove_file(path).map_err(|error| boxed(redb::StorageError::Io(error)))?;
        // Opening the table in a write transaction creates it, so a read before any write
        // finds it.
        store.write(|_| Ok(()))?;
        Ok(store)
    }

    /// Stores `value` under `key`.
    ///
    /// # Errors
    ///
    /// redb's, boxed.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.write(|table| table.insert(key, value).map(drop))
    }

    /// The value under `key`, if any, read in place from the database.
    ///
    /// # Errors
    ///
    /// redb's, boxed.
    pub fn get(
        &self,
        key: &[u8],
    ) -> Result<Option<AccessGuard<'static, &'static [u8]>>, StoreError> {
        let read = self.db.begin_read().map_err(boxed)?;
        let table = read.open_table(TABLE).map_err(boxed)?;
        table.get(key).map_err(boxed)
    }

    /// Removes `key`; whether it was there.
    ///
    /// # Errors
    ///
    /// redb's, boxed.
    pub fn delete(&self, key: &[u8]) -> Result<bool, StoreError> {
        let mut removed = false;
        self.write(|table| {
            removed = table.remove(key)?.is_some();
            Ok(())
        })?;
        Ok(removed)
    }

    /// Runs `change` on the table in a write transaction of its own, and commits it.
    fn write(
        &self,
        change: impl FnOnce(
            &mut redb::Table<'_, &'static [u8], &'static [u8]>,
        ) -> Result<(), redb::StorageError>,
    ) -> Result<(), StoreError> {
        let mut transaction = self.db.begin_write().map_err(boxed)?;
        transaction.set_durability(Durability::None);
        {
            let mut table = transaction.open_table(TABLE).map_err(boxed)?;
            change(&mut table).map_err(boxed)?;
        }
        transaction.commit().map_err(boxed)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_stored_read_and_deleted_in_a_file_with_no_name_left() {
        let path =
            std::env::temp_dir().join(format!("tierbuf-kv-test-{}.redb", std::process::id()));
        let store = Store::create_unlinked(&path).unwrap();
        assert!(
            !path.exists(),
            "the file's name is gone while the store is open"
        );
        assert!(store.get(b"a").unwrap().is_none());
        store.put(b"a", &[1; 5000]).unwrap();
        assert_eq!(store.get(b"a").unwrap().unwrap().value(), &[1; 5000][..]);
        assert!(store.delete(b"a").unwrap());
        assert!(!store.delete(b"a").unwrap());
        assert!(store.get(b"a").unwrap().is_none());
    }
}
