"""Test-only: what a real API server checks in an object before it stores it, and in a list's label selector.

Each piece mirrors one part of Kubernetes, named in its docstring:

* names, label keys and values, annotation keys: ``k8s.io/apimachinery/pkg/util/validation`` (IsDNS1123Subdomain,
  IsDNS1123Label, IsQualifiedName, IsValidLabelValue) as ``k8s.io/apimachinery/pkg/api/validation`` (ValidateObjectMeta)
  and ``k8s.io/apimachinery/pkg/apis/meta/v1/validation`` (ValidateLabels) apply them, with their messages;
* label selectors: the lexer and parser of ``k8s.io/apimachinery/pkg/labels/selector.go``;
* builtin kinds' schemas: the OpenAPI schemas ``kubernetes_validate`` ships (one Kubernetes version: ``K8S_VERSION``);
* custom resources: the structural schema of the installed CRD, as ``k8s.io/apiextensions-apiserver/pkg/apiserver/schema``
  prunes (``pruning``), defaults (``defaulting``) and validates (``validation``) an object.

A refusal is an :class:`Invalid` (422) or a :class:`BadRequest` (400), rendered as the API server's ``Status``.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema

from tests.k8s.chart import VERSIONS

#: the Kubernetes version whose builtin schemas validate builtin kinds: the newest the chart supports
#: (tests/k8s/chart.py VERSIONS, the one place it is pinned), which is the newest kubernetes_validate 1.37.0 ships
K8S_VERSION = VERSIONS[-1]

DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + r"(\." + DNS1123_LABEL_FMT + ")*"
QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"
TOTAL_ANNOTATION_SIZE = 256 * 1024

_DNS1123_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                      "start and end with an alphanumeric character")
_DNS1123_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                          "'.', and must start and end with an alphanumeric character")
_QUALIFIED_NAME_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                       "alphanumeric character")
_LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character")


# --- errors, as k8s.io/apimachinery/pkg/util/validation/field and k8s.io/apimachinery/pkg/api/errors render them

def go_quote(value: Any) -> str:
    """A value as field.Invalid prints it: strings quoted (%q), numbers and booleans bare, the rest as Go's %#v."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return str(value)
    return '"' + type(value).__name__ + '"'


@dataclass
class FieldError:
    """One ``field.Error``: its type (Invalid value, Required value, ...), path, value and detail."""

    kind: str
    path: str
    detail: str = ""
    value: Any = None
    show_value: bool = True

    REASONS = {"Invalid value": "FieldValueInvalid", "Required value": "FieldValueRequired",
               "Unsupported value": "FieldValueNotSupported", "Too long": "FieldValueTooLong",
               "Forbidden": "FieldValueForbidden"}

    def __str__(self) -> str:
        if self.kind in ("Invalid value", "Unsupported value") and self.show_value:
            return f"{self.path}: {self.kind}: {go_quote(self.value)}" + (f": {self.detail}" if self.detail else "")
        return f"{self.path}: {self.kind}" + (f": {self.detail}" if self.detail else "")

    def cause(self) -> dict[str, str]:
        return {"reason": self.REASONS.get(self.kind, "FieldValueInvalid"), "message": str(self).split(": ", 1)[1],
                "field": self.path}


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("Invalid value", path, detail, value)


@dataclass
class APIError(Exception):
    """An error the API server answers with a ``Status`` object."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def status(self) -> dict[str, Any]:
        out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
               "reason": self.reason, "code": self.code}
        if self.details:
            out["details"] = self.details
        return out


def Invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> APIError:  # noqa: N802 - errors.NewInvalid
    """``errors.NewInvalid``: ``<Kind>[.<group>] "<name>" is invalid: <one error | [e1, e2]>`` (422)."""
    qualified = f"{kind}.{group}" if group else kind
    text = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    return APIError(422, "Invalid", f'{qualified} "{name}" is invalid: {text}',
                    {"name": name, "group": group, "kind": kind, "causes": [e.cause() for e in errors]})


def BadRequest(message: str) -> APIError:  # noqa: N802 - errors.NewBadRequest
    return APIError(400, "BadRequest", message)


# --- k8s.io/apimachinery/pkg/util/validation

def regex_error(msg: str, fmt: str, *examples: str) -> str:
    """``validation.RegexError``, with its odd ``',  or '`` joint."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    return msg + " (e.g. " + " or ".join(f"'{e}', " for e in examples) + f"regex used for validation is '{fmt}')"


def max_len_error(n: int) -> str:
    return f"must be no more than {n} characters"


def is_dns1123_label(value: str) -> list[str]:
    errs = [max_len_error(63)] if len(value) > 63 else []
    if not re.fullmatch(DNS1123_LABEL_FMT, value):
        errs.append(regex_error(_DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = [max_len_error(253)] if len(value) > 253 else []
    if not re.fullmatch(DNS1123_SUBDOMAIN_FMT, value):
        errs.append(regex_error(_DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errs


def is_qualified_name(value: str) -> list[str]:
    """``IsQualifiedName``: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        errs: list[str] = []
    elif len(parts) == 2:
        prefix, name = parts
        errs = ["prefix part must be non-empty"] if not prefix else \
            ["prefix part " + e for e in is_dns1123_subdomain(prefix)]
    else:
        return ["a qualified name " + regex_error(_QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name",
                                                  "123-abc")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + max_len_error(63))
    if name and not re.fullmatch(QUALIFIED_NAME_FMT, name):
        errs.append("name part " + regex_error(_QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name",
                                               "123-abc"))
    return errs


def is_valid_label_value(value: str) -> list[str]:
    errs = [max_len_error(63)] if len(value) > 63 else []
    if not re.fullmatch(LABEL_VALUE_FMT, value):
        errs.append(regex_error(_LABEL_VALUE_MSG, LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


# --- k8s.io/apimachinery/pkg/api/validation.ValidateObjectMeta

def validate_object_meta(meta: dict[str, Any], namespaced: bool, name_rule: str = "subdomain") -> list[FieldError]:
    """Name (or generateName), namespace, labels and annotations of an object about to be stored.

    ``name_rule``: ``subdomain`` (NameIsDNSSubdomain: most kinds and every custom resource, as apiextensions'
    customresource validator uses) or ``label`` (NameIsDNSLabel: Namespaces)."""
    check = is_dns1123_label if name_rule == "label" else is_dns1123_subdomain
    errs: list[FieldError] = []
    name, generate = meta.get("name"), meta.get("generateName")
    if generate:
        errs += [invalid("metadata.generateName", generate, m) for m in check(generate.removesuffix("-") or "a")]
    if not name and not generate:
        errs.append(FieldError("Required value", "metadata.name", "name or generateName is required"))
    elif name:
        errs += [invalid("metadata.name", name, m) for m in check(name)]
    if namespaced and meta.get("namespace"):
        errs += [invalid("metadata.namespace", meta["namespace"], m) for m in is_dns1123_label(meta["namespace"])]
    errs += validate_labels(meta.get("labels") or {}, "metadata.labels")
    errs += validate_annotations(meta.get("annotations") or {}, "metadata.annotations")
    return errs


def validate_labels(labels: dict[str, Any], path: str) -> list[FieldError]:
    """``metav1validation.ValidateLabels``: each key a qualified name, each value a label value; the path is the
    map's, not the key's (as the API server reports it)."""
    errs: list[FieldError] = []
    for key, value in labels.items():
        errs += [invalid(path, key, m) for m in is_qualified_name(key)]
        if not isinstance(value, str):
            errs.append(invalid(f"{path}.{key}", value, "must be a string"))
            continue
        errs += [invalid(path, value, m) for m in is_valid_label_value(value)]
    return errs


def validate_annotations(annotations: dict[str, Any], path: str) -> list[FieldError]:
    """``ValidateAnnotations``: keys are qualified names (case-insensitive); keys and values total at most 256 KiB."""
    errs = [invalid(path, k, m) for k in annotations for m in is_qualified_name(k.lower())]
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > TOTAL_ANNOTATION_SIZE:
        errs.append(FieldError("Too long", path, f"may not be more than {TOTAL_ANNOTATION_SIZE} bytes"))
    return errs


# --- k8s.io/apimachinery/pkg/labels: the selector grammar

_SPECIAL = set("!=,()<>")


def _lex(selector: str) -> list[str]:
    """The selector's tokens: operators, parentheses, commas and identifiers (runs of other non-space characters)."""
    tokens, i = [], 0
    while i < len(selector):
        c = selector[i]
        if c.isspace():
            i += 1
        elif selector.startswith(("==", "!="), i):
            tokens.append(selector[i:i + 2])
            i += 2
        elif c in _SPECIAL:
            tokens.append(c)
            i += 1
        else:
            j = i
            while j < len(selector) and not selector[j].isspace() and selector[j] not in _SPECIAL:
                j += 1
            tokens.append(selector[i:j])
            i = j
    return tokens


def _is_ident(tok: str | None) -> bool:
    return tok is not None and tok not in _SPECIAL and tok not in ("==", "!=")


@dataclass
class Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        has, value = self.key in labels, labels.get(self.key)
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        try:  # gt / lt: integers only, as labels.Requirement.Matches
            return has and (int(value) > int(self.values[0]) if self.op == "gt" else int(value) < int(self.values[0]))
        except ValueError:
            return False


class _Parser:
    """``labels.Parser``: requirements separated by commas; its error messages."""

    def __init__(self, selector: str) -> None:
        self.tokens, self.pos = _lex(selector), 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | None:
        tok = self.peek()
        self.pos += 1
        return tok

    @staticmethod
    def shown(tok: str | None) -> str:
        return "" if tok is None else tok

    def parse(self) -> list[Requirement]:
        out: list[Requirement] = []
        while True:
            tok = self.peek()
            if tok is None:
                return out
            if not (_is_ident(tok) or tok == "!"):
                raise ValueError(f"found '{tok}', expected: !, identifier, or 'end of string'")
            try:
                out.append(self.requirement())
            except ValueError as err:
                raise ValueError(f"unable to parse requirement: {err}") from None
            tok = self.take()
            if tok is None:
                return out
            if tok != ",":
                raise ValueError(f"found '{tok}', expected: ',' or 'end of string'")
            nxt = self.peek()
            if not (_is_ident(nxt) or nxt == "!") or nxt in ("in", "notin"):
                raise ValueError(f"found '{self.shown(nxt)}', expected: identifier after ','")

    def requirement(self) -> Requirement:
        negated = self.peek() == "!"
        if negated:
            self.take()
        key = self.take()
        if not _is_ident(key) or key in ("in", "notin"):
            raise ValueError(f"found '{self.shown(key)}', expected: identifier")
        assert key is not None
        if negated:
            return _requirement(key, "!", ())
        if self.peek() in (None, ","):
            return _requirement(key, "exists", ())
        op = self.take()
        if op in ("in", "notin"):
            return _requirement(key, op, self.value_set())
        ops = {"=": "=", "==": "=", "!=": "!=", ">": "gt", "<": "lt"}
        if op not in ops:
            raise ValueError(f"found '{self.shown(op)}', expected: in, notin, =, ==, !=, gt, lt")
        value = self.peek()
        if value in (None, ","):
            return _requirement(key, ops[op], ("",))
        if not _is_ident(value):
            raise ValueError(f"found '{value}', expected: identifier")
        self.take()
        return _requirement(key, ops[op], (str(value),))

    def value_set(self) -> tuple[str, ...]:
        if self.take() != "(":
            raise ValueError(f"found '{self.shown(self.tokens[self.pos - 1] if self.pos <= len(self.tokens) else None)}'"
                             ", expected:'('")
        values: list[str] = []
        expect_value = True
        while True:
            tok = self.take()
            if tok == ")":
                if expect_value and values:
                    values.append("")  # a trailing comma: an empty value, as the parser reads it
                return tuple(values)
            if tok == ",":
                if expect_value:
                    values.append("")
                expect_value = True
            elif _is_ident(tok) and expect_value:
                values.append(str(tok))
                expect_value = False
            else:
                raise ValueError(f"found '{self.shown(tok)}', expected: ',', ')' or identifier")


def _requirement(key: str, op: str, values: tuple[str, ...]) -> Requirement:
    """``labels.NewRequirement``: the key a qualified name, each value a label value; its aggregate of errors."""
    errs = [f"key: Invalid value: {go_quote(key)}: {m}" for m in is_qualified_name(key)]
    if op in ("in", "notin") and not values:
        errs.append("values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty")
    for i, v in enumerate(values):
        msgs = is_valid_label_value(v)
        if msgs:
            errs.append(f"values[{i}][{key}]: Invalid value: {go_quote(v)}: {'; '.join(msgs)}")
    if op in ("gt", "lt") and not re.fullmatch(r"-?\d+", values[0]):
        errs.append(f"values[0]: Invalid value: {go_quote(values[0])}: for 'Gt', 'Lt' operators, the value must "
                    "be an integer")
    if errs:
        raise ValueError(errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
    return Requirement(key, op, values)


def parse_selector(selector: str | None) -> list[Requirement]:
    """``labels.Parse``: the requirements of a label selector, or :class:`APIError` 400 as the API server answers a
    list or watch with an invalid ``labelSelector``."""
    if not selector or not selector.strip():
        return []
    try:
        return _Parser(selector).parse()
    except ValueError as err:
        raise BadRequest(str(err)) from None


def match_labels(labels: dict[str, str], selector: str | list[Requirement] | None) -> bool:
    """Whether ``labels`` satisfy ``selector`` (a selector string, or the requirements parsed from one)."""
    reqs = parse_selector(selector) if isinstance(selector, str) or selector is None else selector
    return all(r.matches(labels) for r in reqs)


# --- builtin kinds: the OpenAPI schemas kubernetes_validate ships

@functools.lru_cache(maxsize=1)
def _definitions() -> referencing.Registry:
    from kubernetes_validate import utils

    version = f"v{K8S_VERSION}-local"
    defs = utils.schema_contents(f"kubernetes-json-schema/{version}/_definitions.json", K8S_VERSION)
    return referencing.Resource.from_contents(defs, default_specification=referencing.jsonschema.DRAFT202012) \
        @ referencing.Registry()


@functools.lru_cache(maxsize=128)
def builtin_validator(kind: str, api_version: str) -> jsonschema.Draft202012Validator | None:
    """The validator of one builtin kind (``None``: kubernetes_validate has no schema for it), as
    ``kubernetes_validate.validate`` builds it but loaded once: its non-strict schema (unknown fields are
    pruned by the emulator, not refused, as the API server's default ``fieldValidation=Warn`` does)."""
    from kubernetes_validate import utils

    gv = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = utils.schema_contents(f"kubernetes-json-schema/v{K8S_VERSION}-local/{kind.lower()}-{gv}.json",
                                       K8S_VERSION)
    except FileNotFoundError:
        return None
    registry = referencing.Resource.from_contents(schema, default_specification=referencing.jsonschema.DRAFT202012) \
        @ _definitions()
    return jsonschema.Draft202012Validator(schema, registry=registry)


# --- custom resources: k8s.io/apiextensions-apiserver/pkg/apiserver/schema

def _schema_type_check(node: dict[str, Any]) -> dict[str, Any]:
    """One structural-schema node for jsonschema: ``nullable`` admits null, ``x-kubernetes-int-or-string`` admits
    either, ``x-kubernetes-preserve-unknown-fields`` without ``type`` admits anything."""
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in ("nullable", "default",
                                                                                          "description")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in out:
        out["properties"] = {k: _schema_type_check(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _schema_type_check(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _schema_type_check(out["additionalProperties"])
    for k in ("allOf", "anyOf", "oneOf"):
        if k in node and isinstance(node[k], list):
            out[k] = [_schema_type_check(s) for s in node[k]]
    if "not" in out and isinstance(out["not"], dict):
        out["not"] = _schema_type_check(out["not"])
    return out


@dataclass
class StructuralSchema:
    """A CRD version's ``openAPIV3Schema``: prune, default, validate."""

    schema: dict[str, Any]

    @functools.cached_property
    def validator(self) -> jsonschema.Draft4Validator:
        return jsonschema.Draft4Validator(_schema_type_check(self.schema))

    def prune(self, obj: dict[str, Any]) -> list[str]:
        """``pruning.Prune``: drop fields the schema does not declare (unless it preserves unknown fields there) and
        null values of non-nullable fields (``PruneNonNullableNulls``). ``apiVersion``, ``kind`` and ``metadata`` at
        the root are kept. Returns the dropped paths (the API server's ``unknown field`` warnings)."""
        dropped: list[str] = []
        _prune(obj, self.schema, "", dropped, root=True)
        return dropped

    def default(self, obj: dict[str, Any]) -> None:
        """``defaulting.Default``: an absent property with a ``default`` gets it (then its own defaults)."""
        _default(obj, self.schema)

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[FieldError]:
        """The schema's errors, in the wording of ``k8s.io/kube-openapi/pkg/validation`` as the API server shows it,
        then (if none) its CEL rules (``x-kubernetes-validations``), ``oldSelf`` from ``old`` on an update."""
        body = {k: v for k, v in obj.items() if k != "metadata"}
        errors = [_openapi_error(e) for e in sorted(self.validator.iter_errors(body), key=lambda e: list(e.path))]
        if errors:
            return errors
        return _cel_errors(body, {k: v for k, v in old.items() if k != "metadata"} if old is not None else None,
                           self.schema, "")


_MISSING = object()


@functools.lru_cache(maxsize=256)
def _cel_program(rule: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_errors(value: Any, old: Any, schema: dict[str, Any], path: str) -> list[FieldError]:
    """``k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel``: each ``x-kubernetes-validations`` rule of a node
    holds for its value (``self``); a transition rule (one naming ``oldSelf``) only on an update where the node had an
    old value. A broken rule is reported as the API server reports a rule it cannot evaluate."""
    import celpy

    errs: list[FieldError] = []
    where = path.lstrip(".") or "<root>"
    for rule in schema.get("x-kubernetes-validations") or []:
        transition = "oldSelf" in rule["rule"]
        if transition and (old is _MISSING or old is None):  # a create, or a node new in this update
            continue
        env = {"self": celpy.json_to_cel(value)}
        if transition:
            env["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok = bool(_cel_program(rule["rule"]).evaluate(env))
        except Exception as err:  # noqa: BLE001 - a rule error is a validation error, as on the API server
            errs.append(FieldError("Invalid value", where, f"rule compiler/evaluation error: {err}",
                                   _type_name(value)))
            continue
        if not ok:
            field_path = (path + rule["fieldPath"]).lstrip(".") if rule.get("fieldPath") else where
            kind = {"FieldValueForbidden": "Forbidden", "FieldValueRequired": "Required value",
                    "FieldValueDuplicate": "Duplicate value"}.get(rule.get("reason", ""), "Invalid value")
            errs.append(FieldError(kind, field_path, rule.get("message") or f"failed rule: {rule['rule']}",
                                   _type_name(value)))
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        addl = schema.get("additionalProperties")
        for key, sub_value in value.items():
            sub = props.get(key) or (addl if isinstance(addl, dict) else None)
            if sub is not None:
                sub_old = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                errs += _cel_errors(sub_value, sub_old, sub, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):  # list items: no old value correlated (atomic lists)
            errs += _cel_errors(item, _MISSING, schema["items"], f"{path}[{i}]")
    return errs


def _prune(value: Any, schema: dict[str, Any], path: str, dropped: list[str], root: bool = False) -> None:
    if isinstance(value, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        for key in list(value):
            sub = (props or {}).get(key)
            if sub is None and isinstance(addl, dict):
                sub = addl
            if root and key in ("apiVersion", "kind", "metadata"):
                continue
            if sub is None:
                if not preserve and addl is not True:
                    dropped.append(f"{path}.{key}".lstrip("."))
                    del value[key]
                continue
            if value[key] is None and not sub.get("nullable"):
                del value[key]  # a null of a non-nullable field is dropped, not refused
                continue
            _prune(value[key], sub, f"{path}.{key}", dropped)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _prune(item, schema["items"], f"{path}[{i}]", dropped)


def _default(value: Any, schema: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(value[key], sub)
        if isinstance(schema.get("additionalProperties"), dict):
            for key in set(value) - set(schema.get("properties") or {}):
                _default(value[key], schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(item, schema["items"])


def _path(error: jsonschema.ValidationError) -> str:
    out = ""
    for p in error.absolute_path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out.lstrip(".")


def _openapi_error(e: jsonschema.ValidationError) -> FieldError:
    """A jsonschema error in kube-openapi's words (``spec.x in body must be of type integer: "string"``)."""
    path = _path(e)
    where = path or "<root>"
    if e.validator == "required":
        missing = re.search(r"'([^']+)' is a required property", e.message)
        name = missing.group(1) if missing else "?"
        return FieldError("Required value", f"{path}.{name}".lstrip("."))
    if e.validator == "enum":
        return FieldError("Unsupported value", where, "supported values: " +
                          ", ".join(go_quote(v) for v in e.validator_value), e.instance)
    if e.validator == "type":
        t = e.validator_value if isinstance(e.validator_value, str) else e.validator_value[0]
        return invalid(where, _type_name(e.instance), f"{where} in body must be of type {t}: "
                                                      f"{go_quote(_type_name(e.instance))}")
    words = {"minimum": "should be greater than or equal to", "maximum": "should be less than or equal to",
             "minLength": "should be at least", "maxLength": "may not be longer than", "pattern": "should match",
             "minItems": "should have at least", "maxItems": "should have at most"}
    if e.validator in words:
        suffix = {"minLength": " chars long", "maxLength": "", "minItems": " items", "maxItems": " items"}
        return invalid(where, e.instance, f"{where} in body {words[str(e.validator)]} "
                                          f"{go_quote(e.validator_value) if e.validator == 'pattern' else e.validator_value}"
                                          f"{suffix.get(str(e.validator), '')}")
    return invalid(where, e.instance, e.message)


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number",
            type(None): "null"}.get(type(value), "unknown")


def schema_errors(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[FieldError]:
    """A builtin kind's schema errors (metadata is checked by :func:`validate_object_meta`)."""
    body = {k: v for k, v in obj.items() if k != "metadata"}
    body["metadata"] = {}  # present (a schema may require it: Event's does), its content checked elsewhere
    return [_openapi_error(e) for e in sorted(validator.iter_errors(body), key=lambda e: list(e.path))]


@functools.lru_cache(maxsize=128)
def _strict_builtin_validator(kind: str, api_version: str) -> jsonschema.Draft202012Validator | None:
    from kubernetes_validate import utils

    gv = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict"
    try:
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{gv}.json", K8S_VERSION)
    except FileNotFoundError:
        return None
    defs = utils.schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
    spec = referencing.jsonschema.DRAFT202012
    registry = referencing.Resource.from_contents(schema, default_specification=spec) @ (
        referencing.Resource.from_contents(defs, default_specification=spec) @ referencing.Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def prune_builtin_unknown(kind: str, api_version: str, obj: dict[str, Any]) -> list[str]:
    """Drop the fields a builtin kind does not have, as the API server's decoder does (the default
    ``fieldValidation=Warn`` drops them and warns), and return their paths."""
    validator = _strict_builtin_validator(kind, api_version)
    if validator is None:
        return []
    dropped: list[str] = []
    for e in list(validator.iter_errors(obj)):
        if e.validator != "additionalProperties" or not isinstance(e.instance, dict):
            continue
        known = set((e.schema or {}).get("properties") or {})
        for key in [k for k in e.instance if k not in known]:
            dropped.append(f"{_path(e)}.{key}".lstrip("."))
            del e.instance[key]
    return dropped
