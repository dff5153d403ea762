//! Placeholder library; filled in by the issue that builds this binary.

/// Runs the program. Placeholder: does nothing yet.
pub fn run() -> anyhow::Result<()> {
    Ok(())
}
