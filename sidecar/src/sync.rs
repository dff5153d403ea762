//! Locking helper shared by the crate's maps.

/// Locks a mutex, taking the data even if a panicking thread poisoned it (the proxy's maps
/// stay usable; a panic is reported where it happened).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
