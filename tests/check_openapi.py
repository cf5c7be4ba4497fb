#!/usr/bin/python3
"""Checks schema/openapi.yaml against the code (run by tests/test_openapi.c).

  check_openapi.py routes SPEC SERVER_C
      The spec parses, is OpenAPI 3.1, every $ref resolves, every route of
      the routes[] table in api/server.c is documented with its method (and
      nothing else is), every path parameter is declared, and every error
      response is the Error schema.

  check_openapi.py validate SPEC SAMPLES_DIR
      Every SAMPLES_DIR/*.json, {"method", "path" (the route template,
      e.g. /v1/jobs/{id}), "status", "body"}, is a real reply of capd; its
      body must match the schema the spec gives for that status.

Exit status 0 when everything holds, 1 with one line per problem otherwise,
2 when the checker itself cannot run (no PyYAML: install python3-yaml).
"""
import json
import os
import re
import sys

try:
    import yaml
except ImportError:  # pragma: no cover
    sys.stderr.write("check_openapi: PyYAML is missing (apt-get install python3-yaml)\n")
    sys.exit(2)

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def load_spec(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def resolve(spec, node, seen=None):
    """Follows $ref chains; returns the referenced node."""
    seen = seen or set()
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        if ref in seen:
            raise ValueError("reference cycle at %s" % ref)
        seen.add(ref)
        if not ref.startswith("#/"):
            raise ValueError("external reference %s" % ref)
        cur = spec
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(cur, dict) or part not in cur:
                raise ValueError("unresolved reference %s" % ref)
            cur = cur[part]
        node = cur
    return node


def all_refs(node, out):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            out.append(node["$ref"])
        for v in node.values():
            all_refs(v, out)
    elif isinstance(node, list):
        for v in node:
            all_refs(v, out)


def parse_routes(server_c):
    """The (METHOD, /path/{param}) pairs of the routes[] table."""
    with open(server_c, encoding="utf-8") as f:
        src = f.read()
    m = re.search(r"routes\s*\[\s*\]\s*=\s*\{(.*?)\n\};", src, re.S)
    if not m:
        raise ValueError("no routes[] table in %s" % server_c)
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    pairs = re.findall(r'\{\s*"([A-Z]+)"\s*,\s*"([^"]+)"\s*,\s*\w+\s*(?:,\s*\w+\s*){0,4}\}', body)
    if not pairs:
        raise ValueError("routes[] table in %s has no entries" % server_c)
    return [(meth, re.sub(r":(\w+)", r"{\1}", pat)) for meth, pat in pairs]


def is_error_schema(spec, schema):
    schema = resolve(spec, schema)
    if schema is resolve(spec, {"$ref": "#/components/schemas/Error"}):
        return True
    return any(is_error_schema(spec, s) for s in schema.get("allOf", []))


def check_routes(spec_path, server_c):
    problems = []
    spec = load_spec(spec_path)
    if not isinstance(spec, dict):
        return ["the spec is not a mapping"]
    if not str(spec.get("openapi", "")).startswith("3.1"):
        problems.append("openapi must be 3.1.x, got %r" % spec.get("openapi"))
    for key in ("info", "paths", "components"):
        if key not in spec:
            problems.append("missing top-level %s" % key)
    if problems:
        return problems
    refs = []
    all_refs(spec, refs)
    for ref in sorted(set(refs)):
        try:
            resolve(spec, {"$ref": ref})
        except ValueError as e:
            problems.append(str(e))

    err = spec["components"].get("schemas", {}).get("Error")
    inner = (err or {}).get("properties", {}).get("error", {})
    if sorted(inner.get("required", [])) != ["code", "field", "message"]:
        problems.append("Error must require error.code, error.message and error.field")

    routes = parse_routes(server_c)
    paths = spec["paths"]
    for meth, path in routes:
        item = paths.get(path)
        if item is None:
            problems.append("route %s %s is not in openapi paths" % (meth, path))
        elif meth.lower() not in item:
            problems.append("route %s %s: method missing in openapi" % (meth, path))
    documented = set()
    op_ids = {}
    for path, item in paths.items():
        for meth in METHODS:
            if meth not in item:
                continue
            documented.add((meth.upper(), path))
            op = item[meth]
            oid = op.get("operationId")
            if not oid:
                problems.append("%s %s has no operationId" % (meth.upper(), path))
            elif oid in op_ids:
                problems.append("operationId %s is used twice" % oid)
            else:
                op_ids[oid] = path
            params = [resolve(spec, p) for p in item.get("parameters", []) + op.get("parameters", [])]
            declared = {p.get("name") for p in params if p.get("in") == "path"}
            for name in re.findall(r"\{(\w+)\}", path):
                if name not in declared:
                    problems.append("%s %s: path parameter {%s} not declared" % (meth.upper(), path, name))
            for p in params:
                if p.get("in") == "path" and not p.get("required"):
                    problems.append("%s %s: path parameter %s must be required" % (meth.upper(), path, p.get("name")))
            responses = op.get("responses") or {}
            if not responses:
                problems.append("%s %s has no responses" % (meth.upper(), path))
            if "405" not in responses:
                problems.append("%s %s: 405 (wrong method) not documented" % (meth.upper(), path))
            for code, resp in responses.items():
                code = str(code)
                resp = resolve(spec, resp)
                if not code[0] in "45":
                    continue
                schema = (resp.get("content") or {}).get("application/json", {}).get("schema")
                if schema is None or not is_error_schema(spec, schema):
                    problems.append("%s %s: response %s is not the Error schema" % (meth.upper(), path, code))
            if "requestBody" in op:
                rb = resolve(spec, op["requestBody"])
                types = set(rb.get("content") or {})
                # JSON, or the raw bytes of a remote attempt's stream
                if not types or not types <= {"application/json", "application/octet-stream"}:
                    problems.append("%s %s: request body is not application/json" % (meth.upper(), path))
                for code in ("400", "413") + (("415",) if "application/json" in types else ()):
                    if code not in responses:
                        problems.append("%s %s takes a body but does not document %s" % (meth.upper(), path, code))
    for meth, path in sorted(documented - set(routes)):
        problems.append("openapi documents %s %s, which api/server.c does not route" % (meth, path))
    return problems


# ---- a small JSON Schema validator for the subset the spec uses ----

TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}

KNOWN = {"type", "properties", "required", "additionalProperties", "items", "enum", "const",
         "allOf", "oneOf", "anyOf", "$ref", "pattern", "minimum", "maximum", "exclusiveMinimum",
         "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems",
         "maxProperties", "propertyNames", "format", "description", "examples", "default",
         "title"}


def validate(spec, schema, value, where, errors):
    schema = resolve(spec, schema)
    if schema is True or schema == {}:
        return
    unknown = set(schema) - KNOWN
    if unknown:
        errors.append("%s: schema uses unsupported keywords %s" % (where, sorted(unknown)))
    t = schema.get("type")
    if t is not None:
        ts = t if isinstance(t, list) else [t]
        if not any(TYPES[x](value) for x in ts):
            errors.append("%s: %r is not %s" % (where, value, "/".join(ts)))
            return
    if "const" in schema and value != schema["const"]:
        errors.append("%s: %r is not %r" % (where, value, schema["const"]))
    if "enum" in schema and value not in schema["enum"]:
        errors.append("%s: %r not in %r" % (where, value, schema["enum"]))
    for s in schema.get("allOf", []):
        validate(spec, s, value, where, errors)
    for key in ("oneOf", "anyOf"):
        if key in schema:
            ok = 0
            for s in schema[key]:
                e = []
                validate(spec, s, value, where, e)
                ok += not e
            if ok == 0 or (key == "oneOf" and ok > 1):
                errors.append("%s: %r matches %d of the %s alternatives" % (where, value, ok, key))
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append("%s: %r does not match %s" % (where, value, schema["pattern"]))
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append("%s: %r shorter than %d" % (where, value, schema["minLength"]))
        if "maxLength" in schema and len(value.encode()) > schema["maxLength"]:
            errors.append("%s: longer than %d" % (where, schema["maxLength"]))
        if schema.get("format") == "date-time" and not re.match(
                r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$", value):
            errors.append("%s: %r is not a date-time" % (where, value))
    if TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append("%s: %r < %r" % (where, value, schema["minimum"]))
        if "maximum" in schema and value > schema["maximum"]:
            errors.append("%s: %r > %r" % (where, value, schema["maximum"]))
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errors.append("%s: %r <= %r" % (where, value, schema["exclusiveMinimum"]))
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            errors.append("%s: %r >= %r" % (where, value, schema["exclusiveMaximum"]))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append("%s: fewer than %d items" % (where, schema["minItems"]))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append("%s: more than %d items" % (where, schema["maxItems"]))
        if schema.get("uniqueItems"):
            dumped = [json.dumps(v, sort_keys=True) for v in value]
            if len(set(dumped)) != len(dumped):
                errors.append("%s: items are not unique" % where)
        if "items" in schema:
            for i, v in enumerate(value):
                validate(spec, schema["items"], v, "%s[%d]" % (where, i), errors)
    if isinstance(value, dict):
        for r in schema.get("required", []):
            if r not in value:
                errors.append("%s: missing required %s" % (where, r))
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append("%s: more than %d members" % (where, schema["maxProperties"]))
        props = schema.get("properties", {})
        addl = schema.get("additionalProperties", True)
        for k, v in value.items():
            if "propertyNames" in schema:
                validate(spec, schema["propertyNames"], k, "%s(name %s)" % (where, k), errors)
            if k in props:
                validate(spec, props[k], v, "%s.%s" % (where, k), errors)
            elif addl is False:
                # allOf siblings may declare it; only flag when no sibling does
                errors.append("%s: unexpected member %s" % (where, k))
            elif isinstance(addl, dict):
                validate(spec, addl, v, "%s.%s" % (where, k), errors)


def check_samples(spec_path, samples_dir):
    spec = load_spec(spec_path)
    problems = []
    files = sorted(f for f in os.listdir(samples_dir) if f.endswith(".json"))
    if not files:
        return ["no samples in %s" % samples_dir]
    for name in files:
        with open(os.path.join(samples_dir, name), encoding="utf-8") as f:
            s = json.load(f)
        meth, path, status = s["method"].lower(), s["path"], str(s["status"])
        op = spec["paths"].get(path, {}).get(meth)
        if op is None:
            problems.append("%s: %s %s is not documented" % (name, meth.upper(), path))
            continue
        resp = op.get("responses", {}).get(status)
        if resp is None:
            problems.append("%s: %s %s does not document status %s" % (name, meth.upper(), path, status))
            continue
        resp = resolve(spec, resp)
        ctype = s.get("content_type", "application/json")
        media = (resp.get("content") or {}).get(ctype)
        if media is None:
            problems.append("%s: %s %s %s has no %s content" % (name, meth.upper(), path, status, ctype))
            continue
        if ctype != "application/json":
            continue
        errors = []
        validate(spec, media.get("schema", {}), s["body"], "%s %s %s body" % (meth.upper(), path, status), errors)
        problems.extend("%s: %s" % (name, e) for e in errors)
    return problems


def main(argv):
    if len(argv) != 4 or argv[1] not in ("routes", "validate"):
        sys.stderr.write("usage: check_openapi.py routes SPEC SERVER_C | validate SPEC SAMPLES_DIR\n")
        return 2
    try:
        if argv[1] == "routes":
            problems = check_routes(argv[2], argv[3])
        else:
            problems = check_samples(argv[2], argv[3])
    except (OSError, ValueError, yaml.YAMLError) as e:
        problems = [str(e)]
    for p in problems:
        print("check_openapi: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
