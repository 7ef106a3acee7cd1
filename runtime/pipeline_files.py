"""Pipeline files the runtime writes or reads for a caller: the one-stage pipeline around a
bundle opened on its own, and the voices a pipeline names that are not exported yet."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from runtime.artifacts import verify_bundle
from runtime.paths import data_dir, expand_data_placeholder

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.artifacts import VerifiedBundle
    from runtime.devices import Topology

#: Memory a bundle opened on its own asks for beyond twice its files (interpreter, runtime).
BUNDLE_BASE_DEMAND = 128 * 1024 * 1024


def bundle_pipeline_text(
    manifest_path: Path, component: str, total_size: int, ram: int | None
) -> str:
    """A one-stage CPU pipeline around a bundle opened on its own."""
    demand = BUNDLE_BASE_DEMAND + 2 * total_size
    capacity = max(ram or 0, demand)
    document = {
        "pipeline": f"bundle_{component}",
        "description": f"The bundle {component} in one ONNX Runtime stage on the CPU "
        f"(made by the studio from {manifest_path}).",
        "async_chunk": False,
        "stages": [
            {
                "stage_id": 0,
                "backend": {
                    "name": "external.graph.v1",
                    "manifest": str(manifest_path),
                    "route": {
                        "name": "local-cpu",
                        "interpreter": "bundled",
                        "worker": "ort",
                        "ep": "cpu",
                        "os_domain": "posix",
                        "max_io_bytes": max(64 * 1024, 4 * total_size),
                        "min_fraction_on_target": 1.0,
                        "allowed_providers": ["CPUExecutionProvider"],
                    },
                },
                "resource_budget": {
                    "capacities": {"machine:ram": capacity},
                    "demands": {"machine:ram": demand},
                },
            }
        ],
    }
    return yaml.safe_dump(document, sort_keys=False)


def pipeline_for_bundle(
    manifest: Path, topology: Topology, verified: VerifiedBundle | None = None
) -> Path:
    """Write (once) the one-stage pipeline the studio runs a bare bundle with; return its path.
    ``verified`` is the bundle at ``manifest`` when the caller has just verified it."""
    bundle = verify_bundle(manifest) if verified is None else verified
    total = sum(bundle.file_sizes.values())
    ram = topology.constraints.get("machine:ram")
    text = bundle_pipeline_text(
        bundle.manifest_path, bundle.component, total, None if ram is None else ram.capacity
    )
    folder = data_dir() / "bundle-pipelines"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{bundle.component}-{bundle.identity[:12]}.yaml"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


#: A bundle in the user data directory's voice folder, as a pipeline names it.
_DATA_VOICE_MANIFEST = re.compile(r"(\$\{data\}/voices/([A-Za-z0-9._-]+)/[^\s'\"]*manifest\.json)")


def missing_voices(pipeline: Path) -> list[str]:
    """Voices whose bundles ``pipeline`` names under ``${data}/voices/`` but that are found
    neither in the user data directory nor among the voices this installation ships (see
    :func:`runtime.paths.voice_dir`), or are found in an older export format (a previous
    release's export: it is exported again once); an unreadable file names none: loading it
    reports why."""
    from runtime.adapters.voice_bundles import EXPORT_FORMAT, export_format_of

    try:
        text = pipeline.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    missing = set()
    for manifest, voice in _DATA_VOICE_MANIFEST.findall(text):
        path = Path(expand_data_placeholder(manifest))
        found = export_format_of(path) if path.is_file() else None
        if not path.is_file() or (isinstance(found, int) and found != EXPORT_FORMAT):
            missing.add(voice)
    return sorted(missing)


def export_missing_voices(pipeline: Path, progress: Callable[[str], None]) -> list[str]:
    """Export, on first use, the voices :func:`missing_voices` finds from their installed
    packages into the user data directory, and the speech recognisers the pipeline names
    that are not made yet (:func:`runtime.adapters.whisper_export.export_missing_recognisers`)
    and the built-in embedder (:func:`runtime.adapters.embed_bundle.export_missing_embedders`):
    loading refuses a manifest that does not exist, so this runs before the pipeline is
    parsed. Return the names exported (voices, recognisers, then embedders). A shipped voice
    is never missing (the frozen application exports nothing); a voice, recogniser or
    embedder this installation does not know is left for loading the pipeline to report."""
    from runtime.adapters.embed_bundle import export_missing_embedders
    from runtime.adapters.voice_export import KNOWN_VOICES, ensure_voice_bundles
    from runtime.adapters.whisper_export import export_missing_recognisers

    exported = [voice for voice in missing_voices(pipeline) if voice in KNOWN_VOICES]
    for voice in exported:
        ensure_voice_bundles(voice, progress=progress)
    return [
        *exported,
        *export_missing_recognisers(pipeline, progress),
        *export_missing_embedders(pipeline, progress),
    ]


def is_manifest_path(path: Path) -> bool:
    """Whether ``path`` names a bundle (its manifest or its folder) rather than a pipeline."""
    return path.suffix.lower() == ".json" or path.is_dir()
