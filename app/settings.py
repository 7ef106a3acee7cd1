"""The studio's persisted settings (QSettings, an INI file next to the device selection).

The device subset itself lives in the runtime's ``devices.json`` (shared with the CLI);
the studio mirrors it here so a restart can tell the two apart if the file is edited.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

from runtime.paths import config_dir

SETTINGS_FILE = "studio.ini"
MAX_RECENT = 8


class StudioSettings:
    """Typed access to the studio's QSettings."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else config_dir() / SETTINGS_FILE
        self._settings = QSettings(str(self.path), QSettings.Format.IniFormat)

    def sync(self) -> None:
        self._settings.sync()

    def _text(self, key: str) -> str | None:
        value = self._settings.value(key)
        return value if isinstance(value, str) and value else None

    @property
    def last_pipeline(self) -> Path | None:
        text = self._text("pipeline/last")
        return None if text is None else Path(text)

    @last_pipeline.setter
    def last_pipeline(self, path: Path | None) -> None:
        self._settings.setValue("pipeline/last", "" if path is None else str(path))

    @property
    def recent(self) -> list[Path]:
        value = self._settings.value("pipeline/recent")
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            return []
        return [Path(item) for item in value if isinstance(item, str) and item]

    def add_recent(self, path: Path) -> list[Path]:
        recent = [path, *(item for item in self.recent if item != path)][:MAX_RECENT]
        self._settings.setValue("pipeline/recent", [str(item) for item in recent])
        return recent

    @property
    def allowed_devices(self) -> list[str] | None:
        """The mirrored device subset: None for every device."""
        if self._settings.value("devices/all", "true") in ("true", True):
            return None
        value = self._settings.value("devices/allowed", [])
        if isinstance(value, str):
            value = [value]
        return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []

    @allowed_devices.setter
    def allowed_devices(self, allowed: list[str] | None) -> None:
        self._settings.setValue("devices/all", "true" if allowed is None else "false")
        self._settings.setValue("devices/allowed", sorted(allowed or []))

    @property
    def audio_device(self) -> str | None:
        return self._text("audio/device")

    @audio_device.setter
    def audio_device(self, name: str | None) -> None:
        self._settings.setValue("audio/device", name or "")

    @property
    def input_device(self) -> str | None:
        """The audio input Dictate records from (None: the default input)."""
        return self._text("audio/input_device")

    @input_device.setter
    def input_device(self, name: str | None) -> None:
        self._settings.setValue("audio/input_device", name or "")

    @property
    def topology_file(self) -> Path | None:
        text = self._text("devices/topology")
        return None if text is None else Path(text)

    @topology_file.setter
    def topology_file(self, path: Path | None) -> None:
        self._settings.setValue("devices/topology", "" if path is None else str(path))

    def geometry(self, key: str) -> QByteArray | None:
        value = self._settings.value(f"window/{key}")
        return value if isinstance(value, QByteArray) and not value.isEmpty() else None

    def set_geometry(self, key: str, value: QByteArray) -> None:
        self._settings.setValue(f"window/{key}", value)
