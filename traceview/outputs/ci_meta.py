"""Where a recorded run came from: commit, branch, CI system, build and host, read from the
environment the common CI systems set, and ``--meta key=value`` pairs over them.

Pure functions of the mapping they are given (``os.environ`` at the call site), so the rules
are tested on plain dicts. A system is recognised by its own marker variable, and only its
variables are read: a GitHub job that also exports ``GIT_COMMIT`` is not taken for Jenkins.

>>> ci_metadata({"GITHUB_ACTIONS": "true", "GITHUB_SHA": "abc123", "GITHUB_REF_NAME": "main"})
{'ci': 'github', 'commit': 'abc123', 'branch': 'main'}
>>> ci_metadata({"JENKINS_URL": "http://j/", "GIT_COMMIT": "def", "GIT_BRANCH": "origin/dev"})
{'ci': 'jenkins', 'commit': 'def', 'branch': 'dev', 'build_url': 'http://j/'}
>>> ci_metadata({})
{}
"""

from __future__ import annotations

from collections.abc import Mapping

from traceview.errors import UsageError

#: (system, marker variable, {field: variables tried in order}). The first system whose marker
#: is set wins. ``branch`` prefers the merge request's source branch where the system has one
#: (the ref of a merge-request pipeline is not a branch).
SYSTEMS: tuple[tuple[str, str, dict[str, tuple[str, ...]]], ...] = (
    ("github", "GITHUB_ACTIONS", {
        "commit": ("GITHUB_SHA",), "branch": ("GITHUB_HEAD_REF", "GITHUB_REF_NAME"),
        "build": ("GITHUB_RUN_ID",), "runner": ("RUNNER_NAME",)}),
    ("gitlab", "GITLAB_CI", {
        "commit": ("CI_COMMIT_SHA",),
        "branch": ("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME", "CI_COMMIT_REF_NAME"),
        "build": ("CI_PIPELINE_ID",), "build_url": ("CI_JOB_URL",),
        "merge_request": ("CI_MERGE_REQUEST_IID",), "runner": ("CI_RUNNER_DESCRIPTION",)}),
    ("buildkite", "BUILDKITE", {
        "commit": ("BUILDKITE_COMMIT",), "branch": ("BUILDKITE_BRANCH",),
        "build": ("BUILDKITE_BUILD_NUMBER",), "build_url": ("BUILDKITE_BUILD_URL",),
        "merge_request": ("BUILDKITE_PULL_REQUEST",), "runner": ("BUILDKITE_AGENT_NAME",)}),
    ("jenkins", "JENKINS_URL", {
        "commit": ("GIT_COMMIT",), "branch": ("CHANGE_BRANCH", "BRANCH_NAME", "GIT_BRANCH"),
        "build": ("BUILD_NUMBER",), "build_url": ("BUILD_URL", "JENKINS_URL"),
        "merge_request": ("CHANGE_ID",), "runner": ("NODE_NAME",)}),
    ("circleci", "CIRCLECI", {
        "commit": ("CIRCLE_SHA1",), "branch": ("CIRCLE_BRANCH",),
        "build": ("CIRCLE_BUILD_NUM",), "build_url": ("CIRCLE_BUILD_URL",)}),
    ("azure", "TF_BUILD", {
        "commit": ("BUILD_SOURCEVERSION",), "branch": ("BUILD_SOURCEBRANCHNAME",),
        "build": ("BUILD_BUILDID",)}),
)

#: Values that mean "not set" in some systems (Buildkite's pull request is "false").
_UNSET = ("", "false")


def ci_metadata(env: Mapping[str, str]) -> dict[str, str]:
    """``ci``, ``commit``, ``branch`` and what else the CI system in ``env`` tells (build,
    build_url, merge_request, runner); empty outside a known CI system."""
    for system, marker, fields in SYSTEMS:
        if env.get(marker, "") in _UNSET:
            continue
        out = {"ci": system}
        for field, names in fields.items():
            value = next((env[n] for n in names if env.get(n, "") not in _UNSET), None)
            if value is not None:
                out[field] = _branch(value) if field == "branch" else value
        return out
    return {}


def _branch(ref: str) -> str:
    """A branch name without the remote or ref prefix Jenkins and others put on it.

    >>> _branch("origin/main"), _branch("refs/heads/dev"), _branch("feature/x")
    ('main', 'dev', 'feature/x')
    """
    for prefix in ("refs/heads/", "origin/"):
        if ref.startswith(prefix):
            return ref[len(prefix):]
    return ref


def parse_meta(items: list[str]) -> dict[str, str]:
    """``["commit=abc", "note=a=b"]`` -> ``{"commit": "abc", "note": "a=b"}`` (``--meta``).

    >>> parse_meta(["commit=abc", "note=a=b"])
    {'commit': 'abc', 'note': 'a=b'}
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--meta wants KEY=VALUE, got {item!r}")
        if not is_utf8(item):  # bytes the shell passed that no database column holds
            raise UsageError(f"--meta {item.encode('utf-8', 'surrogateescape')!r}: not "
                             "valid UTF-8")
        out[key.strip()] = value
    return out


def is_utf8(text: str) -> bool:
    """Whether ``text`` holds no undecodable byte (Python keeps an argument's or a
    variable's invalid UTF-8 as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
