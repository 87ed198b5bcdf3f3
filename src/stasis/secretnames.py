"""What a secret's name, value, hosts and placeholders may be: checked the same in the SDK and the daemon.

A sandbox never holds a secret's value, only a **placeholder**: ``stasis-secret-`` and 32 random hex digits,
which the egress proxy replaces with the value in requests to the hosts the secret is bound to.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from .netpolicy import normalise_rule

SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PLACEHOLDER = re.compile(r"^stasis-secret-[0-9a-f]{32}$")
LINEAGE_PATTERN = re.compile(r"^[0-9a-f]{32}$")
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
REFERENCE = re.compile(r"\$\{secrets\.([A-Za-z_][A-Za-z0-9_-]{0,127})\}")
MAX_VALUE = 16384


def new_placeholder() -> str:
    return "stasis-secret-" + secrets.token_hex(16)


def new_lineage() -> str:
    return secrets.token_hex(16)


def validate_secret_name(name: str) -> str:
    if not SECRET_NAME.fullmatch(name):
        raise ValueError(
            f"invalid secret name {name[:80]!r}: use 1-128 letters, digits, '_' or '-', starting with a letter or '_'"
        )
    return name


def validate_secret_value(value: str) -> str:
    """A value goes into an HTTP header: no control characters (CR/LF would start a header of the sandbox's)."""
    if not value:
        raise ValueError("a secret's value must not be empty")
    if len(value) > MAX_VALUE:
        raise ValueError(f"a secret's value is at most {MAX_VALUE} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("a secret's value must not contain control characters (a newline, a tab, NUL)")
    return value


def validate_secret_hosts(hosts: list[str]) -> list[str]:
    """Hostnames and wildcards only: interception is decided by the name the sandbox sends in its TLS SNI."""
    out = []
    for host in hosts:
        rule = normalise_rule(host)
        if rule == "*" or rule[0].isdigit() or ":" in rule:
            raise ValueError(
                f"a secret is bound to hostnames (api.example.com) or wildcards (*.example.com), not {host[:80]!r}: "
                "the proxy knows a TLS connection's host by the name the client sends"
            )
        out.append(rule)
    return list(dict.fromkeys(out))


def validate_sandbox_secrets(secrets_: Any) -> Any:
    """A list of names (a create: each gets a fresh placeholder) or the name -> placeholder map a sandbox keeps."""
    if isinstance(secrets_, list | tuple):
        secrets_ = {name: new_placeholder() for name in secrets_ if isinstance(name, str)} | {
            name: None for name in secrets_ if not isinstance(name, str)
        }
    if not isinstance(secrets_, dict):
        return secrets_  # pydantic says what the field wants
    for name, placeholder in secrets_.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name) or not SECRET_NAME.fullmatch(name):
            raise ValueError(
                f"a sandbox's secret becomes an environment variable of its name: {str(name)[:80]!r} is not one "
                "(letters, digits and '_', not starting with a digit)"
            )
        if not isinstance(placeholder, str) or not PLACEHOLDER.fullmatch(placeholder):
            raise ValueError(f"the placeholder of secret {name!r} must be stasis-secret- and 32 hex digits")
    return secrets_


def validate_egress_headers(rules: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for host, headers in rules.items():
        (bound,) = validate_secret_hosts([host])
        for header, template in headers.items():
            if not HEADER_NAME.fullmatch(header):
                raise ValueError(f"invalid header name {header[:80]!r}")
            if any(ord(c) < 0x20 or ord(c) == 0x7F for c in template):
                raise ValueError(f"the value of header {header!r} must not contain control characters")
        out[bound] = dict(headers)
    return out


def sandbox_lineage(uses_secrets: bool, has_network: bool, lineage: str | None) -> str | None:
    """The CA lineage of a sandbox's spec: a new one for a sandbox that uses secrets and has none yet."""
    if uses_secrets and not has_network:
        raise ValueError(
            "secrets reach their hosts through the egress proxy: give the sandbox a network "
            "(network=True, or a policy that allows the secrets' hosts)"
        )
    if uses_secrets and lineage is None:
        return new_lineage()
    if lineage is not None and not LINEAGE_PATTERN.fullmatch(lineage):
        raise ValueError("ca_lineage must be 32 hexadecimal digits (the daemon makes it)")
    return lineage


def referenced(template: str) -> list[str]:
    """The secrets a header template names (``${secrets.NAME}``)."""
    return REFERENCE.findall(template)


def referenced_secrets(rules: dict[str, dict[str, str]]) -> list[str]:
    """Every secret a sandbox's header rules name."""
    return [name for headers in rules.values() for template in headers.values() for name in referenced(template)]
