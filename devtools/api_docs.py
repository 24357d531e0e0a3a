"""docs/api.md, the API reference, generated from protos/ortserve/v1/*.proto and their comments.

  python -m devtools.api_docs --out docs/api.md     (what `make api-docs` runs)

The protos are compiled with grpc_tools' protoc into a descriptor set with source
info (the comments); per file this renders each service with its RPCs (request ->
response, streams marked), each message with a table of its fields and each enum
with its values, in the order the file declares them. The output depends on the
protos only (no timestamps, no paths of this machine), so `make api-docs-check`
can compare it with the committed docs/api.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "ortserve.v1"
OUT = Path("docs") / "api.md"

# FileDescriptorProto field numbers, the first element of a SourceCodeInfo path.
_MESSAGE, _ENUM, _SERVICE, _SYNTAX = 4, 5, 6, 12
# DescriptorProto: field 2, nested_type 3, enum_type 4; EnumDescriptorProto: value 2;
# ServiceDescriptorProto: method 2.
_FIELD, _NESTED, _NESTED_ENUM, _VALUE, _METHOD = 2, 3, 4, 2, 2

_F = descriptor_pb2.FieldDescriptorProto


def proto_files(root: Path = ROOT) -> list[str]:
    """The protos to document, relative to root, sorted by name."""
    return sorted(p.relative_to(root).as_posix()
                  for p in (root / "protos" / "ortserve" / "v1").glob("*.proto"))


def compile_protos(root: Path = ROOT) -> descriptor_pb2.FileDescriptorSet:
    """The descriptor set of the protos, comments included (google's come with grpc_tools)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I", "protos",
               "--include_source_info", f"--descriptor_set_out={out}", *proto_files(root)]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"api_docs: protoc failed (exit {done.returncode}):\n{done.stderr}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


class _Comments:
    """The comments of one file by their SourceCodeInfo path."""

    def __init__(self, f: descriptor_pb2.FileDescriptorProto):
        self.locations = {tuple(loc.path): loc for loc in f.source_code_info.location}

    def get(self, path: tuple[int, ...]) -> str:
        loc = self.locations.get(path)
        if loc is None:
            return ""
        return _dedent(loc.leading_comments or loc.trailing_comments)

    def line(self, path: tuple[int, ...]) -> int:
        loc = self.locations.get(path)
        return loc.span[0] if loc is not None else 0

    def file_comment(self) -> str:
        """The comment above `syntax = ...`, detached or not (the file's own description)."""
        loc = self.locations.get((_SYNTAX,))
        if loc is None:
            return ""
        parts = [*loc.leading_detached_comments, loc.leading_comments]
        return "\n\n".join(c for c in (_dedent(p) for p in parts) if c)


def _dedent(comment: str) -> str:
    lines = [line[1:] if line.startswith(" ") else line for line in comment.split("\n")]
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def _escape(text: str) -> str:
    """Comment text as literal markdown (no emphasis, no HTML)."""
    for ch in ("\\", "*", "`"):
        text = text.replace(ch, "\\" + ch)
    # An underscore inside a word (max_new_tokens) never starts emphasis; one at a word's
    # edge (*_bytes) might, so only those are escaped.
    text = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _paragraph(text: str) -> str:
    return _escape(text)


def _cell(text: str) -> str:
    """A comment as one table cell: its lines joined, pipes escaped."""
    return " ".join(_escape(text).split()).replace("|", "\\|")


def _anchor(full_name: str) -> str:
    return full_name.lstrip(".").replace(".", "-").replace("/", "-").lower()


def _type_ref(type_name: str) -> str:
    """`.ortserve.v1.X.Y` as a link to its section; other packages' types by full name."""
    name = type_name.lstrip(".")
    if name.startswith(PACKAGE + "."):
        short = name[len(PACKAGE) + 1:]
        return f"[`{short}`](#{_anchor(name)})"
    return f"`{name}`"


def _scalar(field: descriptor_pb2.FieldDescriptorProto) -> str:
    return _F.Type.Name(field.type).removeprefix("TYPE_").lower()


class _Renderer:
    def __init__(self, fds: descriptor_pb2.FileDescriptorSet):
        self.files = sorted((f for f in fds.file if f.package == PACKAGE), key=lambda f: f.name)
        self.map_entries: dict[str, descriptor_pb2.DescriptorProto] = {}
        for f in self.files:
            for message, full in self._all_messages(f.message_type, "." + f.package):
                if message.options.map_entry:
                    self.map_entries[full] = message
        self.out: list[str] = []

    @staticmethod
    def _all_messages(messages, prefix):
        for m in messages:
            full = f"{prefix}.{m.name}"
            yield m, full
            yield from _Renderer._all_messages(m.nested_type, full)

    def emit(self, *lines: str) -> None:
        self.out.extend(lines)

    def field_type(self, field: descriptor_pb2.FieldDescriptorProto) -> tuple[str, str]:
        """(type, label) of a field as the table shows them."""
        entry = self.map_entries.get(field.type_name) if field.type == _F.TYPE_MESSAGE else None
        if entry is not None:
            key, value = entry.field[0], entry.field[1]
            return f"map&lt;{self.field_type(key)[0]}, {self.field_type(value)[0]}&gt;", "map"
        if field.type in (_F.TYPE_MESSAGE, _F.TYPE_ENUM):
            type_ = _type_ref(field.type_name)
        else:
            type_ = f"`{_scalar(field)}`"
        if field.label == _F.LABEL_REPEATED:
            return type_, "repeated"
        if field.proto3_optional:
            return type_, "optional"
        return type_, ""

    def render(self) -> str:
        self.emit("# ortserve API reference", "",
                  "<!-- Generated by `make api-docs` (devtools/api_docs.py) from "
                  "protos/ortserve/v1/*.proto; do not edit by hand. -->", "",
                  f"Package `{PACKAGE}`. Every RPC, message, field and enum value below "
                  "carries the comment it has in the proto. Servers also offer gRPC health "
                  "and server reflection (`grpcurl -plaintext localhost:50051 list`).", "",
                  # NOTE: this page is the generated half of the API's docs; the hand-written
                  # half (how to call it, what each failure means) lives beside it in docs/.
                  "How to call it (CLI, Python, grpcurl, any language): [clients.md](clients.md); "
                  "what each failure code means and what to do: [errors.md](errors.md); "
                  "sessions: [sessions.md](features/sessions.md); OpenAI-compatible HTTP: "
                  "[gateway.md](gateway.md).", "")
        for f in self.files:
            self.emit(f"- [{f.name}](#{_anchor(f.name)})")
        self.emit("")
        for f in self.files:
            self.render_file(f)
        return "\n".join(self.out).rstrip("\n") + "\n"

    def render_file(self, f: descriptor_pb2.FileDescriptorProto) -> None:
        comments = _Comments(f)
        self.emit(f'<a id="{_anchor(f.name)}"></a>', "", f"## {f.name}", "")
        about = comments.file_comment()
        if about:
            self.emit(_paragraph(about), "")
        items = [(comments.line((_SERVICE, i)), "service", i) for i in range(len(f.service))]
        items += [(comments.line((_MESSAGE, i)), "message", i) for i in range(len(f.message_type))]
        items += [(comments.line((_ENUM, i)), "enum", i) for i in range(len(f.enum_type))]
        prefix = "." + f.package
        for _, kind, i in sorted(items):
            if kind == "service":
                self.render_service(f.service[i], (_SERVICE, i), comments, prefix)
            elif kind == "message":
                self.render_message(f.message_type[i], (_MESSAGE, i), comments, prefix)
            else:
                self.render_enum(f.enum_type[i], (_ENUM, i), comments, prefix)

    def heading(self, kind: str, full: str) -> None:
        short = full.lstrip(".").removeprefix(PACKAGE + ".")
        self.emit(f'<a id="{_anchor(full)}"></a>', "", f"### {kind} `{short}`", "")

    def render_service(self, service, path, comments, prefix) -> None:
        full = f"{prefix}.{service.name}"
        self.heading("service", full)
        about = comments.get(path)
        if about:
            self.emit(_paragraph(about), "")
        for ri, rpc in enumerate(service.method):
            request = ("stream " if rpc.client_streaming else "") + _type_ref(rpc.input_type)
            response = ("stream " if rpc.server_streaming else "") + _type_ref(rpc.output_type)
            self.emit(f"#### rpc `{service.name}.{rpc.name}`", "",
                      f"{request} -> {response}", "")
            about = comments.get((*path, _METHOD, ri))
            if about:
                self.emit(_paragraph(about), "")

    def render_message(self, message, path, comments, prefix) -> None:
        full = f"{prefix}.{message.name}"
        if message.options.map_entry:
            return
        self.heading("message", full)
        about = comments.get(path)
        if about:
            self.emit(_paragraph(about), "")
        if message.field:
            self.emit("| Field | Type | Label | Number | Description |",
                      "| --- | --- | --- | --- | --- |")
            for fi, field in enumerate(message.field):
                type_, label = self.field_type(field)
                if (field.HasField("oneof_index") and not field.proto3_optional
                        and label == ""):
                    label = f"oneof `{message.oneof_decl[field.oneof_index].name}`"
                self.emit(f"| `{field.name}` | {type_} | {label} | {field.number} | "
                          f"{_cell(comments.get((*path, _FIELD, fi)))} |")
            self.emit("")
        else:
            self.emit("No fields.", "")
        nested = [(comments.line((*path, _NESTED, i)), "message", i)
                  for i in range(len(message.nested_type))]
        nested += [(comments.line((*path, _NESTED_ENUM, i)), "enum", i)
                   for i in range(len(message.enum_type))]
        for _, kind, i in sorted(nested):
            if kind == "message":
                self.render_message(message.nested_type[i], (*path, _NESTED, i), comments, full)
            else:
                self.render_enum(message.enum_type[i], (*path, _NESTED_ENUM, i), comments, full)

    def render_enum(self, enum, path, comments, prefix) -> None:
        self.heading("enum", f"{prefix}.{enum.name}")
        about = comments.get(path)
        if about:
            self.emit(_paragraph(about), "")
        self.emit("| Value | Number | Description |", "| --- | --- | --- |")
        for vi, value in enumerate(enum.value):
            self.emit(f"| `{value.name}` | {value.number} | "
                      f"{_cell(comments.get((*path, _VALUE, vi)))} |")
        self.emit("")


def render(root: Path = ROOT) -> str:
    """docs/api.md's text for the protos under root."""
    return _Renderer(compile_protos(root)).render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / OUT,
                        help="where to write the markdown (default: docs/api.md)")
    args = parser.parse_args(argv)
    args.out.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
