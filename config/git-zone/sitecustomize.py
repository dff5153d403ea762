"""Loaded by the catalog's git server (PYTHONPATH in its zone only): GitPython runs commit hooks
itself (`IndexFile.commit` -> `run_commit_hook`), from `.git/hooks` or the repository's own
`core.hooksPath`, which the agent writes. The git server never needs a hook: they are switched
off here, where the repository cannot reach."""

try:
    import git.index.base as _base
    import git.index.fun as _fun
except Exception:  # not the git server's Python, or GitPython moved: nothing to switch off
    pass
else:

    def _no_hook(name, index, *args):
        return None

    _fun.run_commit_hook = _no_hook
    _base.run_commit_hook = _no_hook
