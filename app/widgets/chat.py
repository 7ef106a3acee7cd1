"""The conversation view of a language-model pipeline: saved conversations, the system prompt,
the transcript with the reply streaming in, and Send, Stop, Regenerate, Copy and New.

On a voice-chat pipeline the view is a spoken conversation's instead: the microphone's
controls (:class:`app.widgets.voice.VoiceControls`) replace the message box, the words being
heard show as the user's pending message and the reply streams in as it is spoken.

The view only turns the user's actions into requests (``submit_requested``: the
conversation's ``{"messages": [...]}``) and the bridge's values (text chunks, the run's
outcome) into the transcript; the window hands requests to the bridge. Conversations are
plain values from :mod:`app.conversations`, saved after each turn.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.conversations import Conversation, ConversationError, ReplyDraft
from app.models import ErrorInfo, RunOutcome, RunState, TextChunk
from app.widgets.audio_input import LevelMeter
from app.widgets.common import NEUTRAL, OK, WARN, StatusChip, dim, section_title
from app.widgets.loading import LoadingView
from app.widgets.voice import VoiceControls

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.conversations import ConversationStore, Status, Turn
    from app.models import LoadView

#: The transcript redraws at most this often while a reply streams in; a long conversation
#: waits longer, so redrawing never takes more than a quarter of the GUI thread's time.
REDRAW_MS = 30
MAX_REDRAW_MS = 500
REDRAW_SHARE = 4
_OUTCOME_STATUS: dict[str, Status] = {"completed": "done", "cancelled": "stopped"}


def _paragraphs(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")


def transcript_html(
    conversation: Conversation,
    draft: ReplyDraft | None,
    palette: QPalette,
    *,
    draft_note: str = "writing",
    heard: str | None = None,
    empty_hint: str = "Write a message below and press Send (Ctrl+Enter). The reply streams "
    "in as the model writes it.",
) -> str:
    """The turns as bubbles: the user's on the right, the assistant's on the left; the user's
    words being heard (``heard``, spoken) then the reply being written last, with a cursor and
    ``draft_note`` (what it waits for); ``empty_hint`` when there is nothing yet."""
    user_bg = palette.color(QPalette.ColorRole.Highlight)
    user_bg.setAlpha(255)
    user_fg = palette.color(QPalette.ColorRole.HighlightedText).name()
    reply_bg = palette.color(QPalette.ColorRole.AlternateBase).name()
    text_fg = palette.color(QPalette.ColorRole.Text).name()
    note_fg = palette.color(QPalette.ColorRole.PlaceholderText).name()
    rows: list[str] = []

    def bubble(content: str, *, user: bool, note: str = "") -> None:
        label = "You" if user else "Assistant"
        extra = f" <i>· {html.escape(note)}</i>" if note else ""
        align = "right" if user else "left"
        head = f'<div align="{align}" style="color:{note_fg}; font-size:small">{label}{extra}</div>'
        colours = (
            f'bgcolor="{user_bg.name()}" style="color:{user_fg}"'
            if user
            else f'bgcolor="{reply_bg}" style="color:{text_fg}"'
        )
        cell = f"<td {colours}>{content or '&nbsp;'}</td>"
        spacer = '<td width="18%"></td>'
        cells = spacer + cell if user else cell + spacer
        rows.append(
            f"{head}"
            f'<table width="100%" cellspacing="0" cellpadding="8"><tr>{cells}</tr></table>'
            '<div style="font-size:4px">&nbsp;</div>'
        )

    for turn in conversation.turns:
        bubble(_paragraphs(turn.content), user=turn.role == "user", note=_turn_note(turn))
    if heard is not None:
        bubble(_paragraphs(heard) + " …", user=True, note="hearing")
    if draft is not None:
        bubble(_paragraphs(draft.text) + " ▍", user=False, note=draft_note)
    if not rows:
        rows.append(f'<p style="color:{note_fg}">{html.escape(empty_hint)}</p>')
    return "".join(rows)


def _turn_note(turn: Turn) -> str:
    if turn.role != "assistant":
        return ""
    note: str = "" if turn.status == "done" else turn.status
    if turn.status == "stopped" and not turn.content:
        note = "stopped before any text"
    if turn.error:
        note = f"{note}: {turn.error}"
    return note


class ChatView(QWidget):
    """Saved conversations on the left; the current one on the right."""

    submit_requested = Signal(object)  # {"messages": [...]}: the next reply's request
    stop_requested = Signal()
    problem = Signal(object)  # ErrorInfo: a conversation file that could not be read or saved
    #: Dictate was clicked: start recording (checked) or stop and transcribe.
    dictate_requested = Signal(bool)

    def __init__(self, store: ConversationStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.pipeline = ""
        self.conversation = Conversation.new("")
        self.draft: ReplyDraft | None = None
        #: Asked before a turn is sent: True when the send must wait (nothing is consumed).
        self.before_send: Callable[[], bool] | None = None
        #: Text chunks the last finished reply arrived in.
        self.reply_chunks = 0
        #: Asked before the Delete button removes a conversation (its title -> go ahead).
        self.confirm_delete: Callable[[str], bool] = self._ask_before_deleting
        self._state = RunState.EMPTY
        #: A spoken conversation runs (the voice-chat pipeline): the list waits for its end.
        self.talking = False
        #: The spoken conversation's pending bubbles: the words being heard, the reply being
        #: spoken, and what the reply's bubble says.
        self.voice_pending: tuple[str | None, str | None, str] = (None, None, "")
        self.voice = VoiceControls()
        #: The stages' load, while the message sent waits for it.
        self.loading = LoadingView(hide_when_ready=True)
        self._reported: set[str] = set()
        self._redraw = QTimer(self)
        self._redraw.setSingleShot(True)
        self._redraw.setInterval(REDRAW_MS)
        self._redraw.timeout.connect(self.redraw)

        self.history = QListWidget()
        self.history.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        # Long titles are cut with an ellipsis (the tooltip names the file) rather than scrolled.
        self.history.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.history.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.history.itemActivated.connect(self._history_activated)
        self.history.currentItemChanged.connect(lambda *_: self._update_buttons())
        self.new_button = QPushButton("New conversation")
        self.open_button = QPushButton("Open")
        self.delete_button = QPushButton("Delete")
        self.history_note = QLabel("")
        self.history_note.setWordWrap(True)
        dim(self.history_note)
        self.new_button.clicked.connect(self.new_conversation)
        self.open_button.clicked.connect(self._open_selected)
        self.delete_button.clicked.connect(self._delete_selected)
        history_buttons = QHBoxLayout()
        history_buttons.addWidget(self.open_button)
        history_buttons.addWidget(self.delete_button)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 4, 0)
        left_layout.addWidget(section_title("Conversations"))
        left_layout.addWidget(self.new_button)
        left_layout.addWidget(self.history, 1)
        left_layout.addLayout(history_buttons)
        left_layout.addWidget(self.history_note)

        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText(
            "System prompt (optional): how the assistant should answer"
        )
        self.system_prompt.setMaximumHeight(64)
        self.transcript = QTextBrowser()
        self.transcript.setOpenLinks(False)
        self.transcript.setMinimumHeight(160)
        self.composer = QPlainTextEdit()
        self.composer.setPlaceholderText("Message (Ctrl+Enter sends)")
        self.composer.setMaximumHeight(80)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.regenerate_button = QPushButton("Regenerate")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the last reply to the clipboard")
        self.dictate_button = QPushButton("Dictate")
        self.dictate_button.setCheckable(True)
        self.dictate_button.setToolTip(
            "Record from the input chosen in Devices; click again to stop. The transcript "
            "goes into the message box"
        )
        self.dictate_button.clicked.connect(self.dictate_requested)
        self.dictate_meter = LevelMeter()
        self.dictate_meter.setMinimumWidth(70)
        self.dictate_meter.setMaximumWidth(120)
        self.dictate_meter.hide()
        self.status = StatusChip("no reply yet")
        self.send_button.clicked.connect(lambda: self.send())
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button.clicked.connect(self.copy_last_reply)
        buttons = QHBoxLayout()
        for button in (self.send_button, self.stop_button, self.regenerate_button):
            buttons.addWidget(button)
        buttons.addWidget(self.copy_button)
        buttons.addWidget(self.dictate_button)
        buttons.addWidget(self.dictate_meter)
        buttons.addStretch(1)
        buttons.addWidget(self.status)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(4, 0, 0, 0)
        self.system_label = QLabel("System prompt")
        right_layout.addWidget(self.system_label)
        right_layout.addWidget(self.system_prompt)
        self.title = section_title(self.conversation.title)
        right_layout.addWidget(self.title)
        right_layout.addWidget(self.loading)
        right_layout.addWidget(self.transcript, 1)
        right_layout.addWidget(self.composer)
        right_layout.addWidget(self.voice)
        right_layout.addLayout(buttons)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setSizes([200, 480])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)
        # The saved conversations are listed by refresh_history(), once ``problem`` is heard.
        self.redraw()

    # -- state -------------------------------------------------------------------------

    @property
    def prompts(self) -> list[str | None]:
        """The prompt the stage rendered for each reply of the conversation, in order."""
        return [turn.prompt for turn in self.conversation.turns if turn.role == "assistant"]

    def set_pipeline(self, name: str) -> None:
        """A chat pipeline was opened: conversations continue with it; an empty one is
        simply retargeted, a finished one stays in the list and a new one starts."""
        self.pipeline = name
        if self.draft is None:
            if self.conversation.turns:
                self.new_conversation()
            else:
                self.conversation = Conversation.new(name, self.system_prompt.toPlainText())
                self.redraw()

    def set_state(self, state: RunState) -> None:
        waited = self.waiting_for_load
        self._state = state
        self._update_buttons()
        if waited != self.waiting_for_load:
            self._show_waiting()

    def show_loading(self, snapshot: LoadView | None) -> None:
        """The bridge's loading progress: shown above the transcript until the model is
        loaded; a message sent meanwhile waits in the transcript, marked so."""
        self.loading.show_snapshot(snapshot)

    @property
    def waiting_for_load(self) -> bool:
        """A message was sent and waits for the stages to load."""
        return (
            self.draft is not None
            and self.draft.request_id is None
            and self._state is RunState.LOADING
        )

    def _show_waiting(self) -> None:
        if self.draft is None:
            return
        if self.waiting_for_load:
            self.status.set_status("waiting for the model to load", WARN)
        self.redraw()

    def _update_buttons(self) -> None:
        idle = self.draft is None and self._state.can_run
        self.send_button.setEnabled(idle)
        self.stop_button.setEnabled(self.draft is not None and self._state.can_cancel)
        has_user_turn = any(turn.role == "user" for turn in self.conversation.turns)
        self.regenerate_button.setEnabled(idle and has_user_turn)
        self.copy_button.setEnabled(self._last_reply() is not None)
        free = self.draft is None and not self.talking
        self.new_button.setEnabled(free)
        selected = self.history.currentItem() is not None
        self.open_button.setEnabled(free and selected)
        self.delete_button.setEnabled(free and selected)
        self.system_prompt.setReadOnly(self.draft is not None)

    def _last_reply(self) -> str | None:
        if self.draft is not None and self.draft.text:
            return self.draft.text
        return self.conversation.last_reply

    # -- user actions ------------------------------------------------------------------

    def send(self, text: str | None = None) -> bool:
        """Add the composer's text (or ``text``) as a user turn and ask for a reply."""
        message = self.composer.toPlainText() if text is None else text
        if not message.strip() or self.draft is not None or not self._state.can_run:
            return False
        if self.before_send is not None and self.before_send():
            # Something must be made first (the window's first-use offer); the text waits.
            return False
        conversation = self.conversation.with_system(self.system_prompt.toPlainText())
        self.conversation = conversation.with_user(message.strip())
        self.composer.clear()
        return self._ask()

    def regenerate(self) -> bool:
        """Ask again for a reply to the last user turn (its previous reply is dropped)."""
        if self.draft is not None or not self._state.can_run:
            return False
        try:
            conversation = self.conversation.for_regeneration()
        except ValueError:
            return False
        self.conversation = conversation.with_system(self.system_prompt.toPlainText())
        return self._ask()

    def stop(self) -> None:
        if self.draft is not None:
            self.stop_requested.emit()

    def copy_last_reply(self) -> bool:
        reply = self._last_reply()
        if reply is None:
            return False
        QGuiApplication.clipboard().setText(reply)
        self.status.set_status("copied", NEUTRAL)
        return True

    def new_conversation(self) -> None:
        if self.draft is not None or self.talking:
            return
        self.conversation = Conversation.new(self.pipeline, self.system_prompt.toPlainText())
        self.history.setCurrentRow(-1)
        self.status.set_status("no reply yet", NEUTRAL)
        self.redraw()

    def open_conversation(self, conversation_id: str) -> bool:
        if self.draft is not None or self.talking:
            return False
        try:
            conversation = self.store.load(conversation_id)
        except ConversationError as exc:
            self.problem.emit(ErrorInfo("The conversation could not be opened", str(exc)))
            self.refresh_history()
            return False
        self.conversation = conversation
        self.system_prompt.setPlainText(conversation.system)
        self.status.set_status(f"{len(conversation.turns)} turns", NEUTRAL)
        self.redraw()
        return True

    def delete_conversation(self, conversation_id: str) -> bool:
        if self.draft is not None or self.talking:
            return False
        try:
            self.store.delete(conversation_id)
        except ConversationError as exc:
            self.problem.emit(ErrorInfo("The conversation was not deleted", str(exc)))
            return False
        finally:
            self.refresh_history()
        if conversation_id == self.conversation.id:
            self.conversation = Conversation.new(self.pipeline, self.system_prompt.toPlainText())
            self.redraw()
        return True

    def _history_activated(self, item: QListWidgetItem) -> None:
        self.open_conversation(str(item.data(Qt.ItemDataRole.UserRole)))

    def _open_selected(self) -> None:
        item = self.history.currentItem()
        if item is not None:
            self._history_activated(item)

    def _delete_selected(self) -> None:
        item = self.history.currentItem()
        if item is not None and self.confirm_delete(item.text().splitlines()[0]):
            self.delete_conversation(str(item.data(Qt.ItemDataRole.UserRole)))

    def _ask_before_deleting(self, title: str) -> bool:
        answer = QMessageBox.question(
            self,
            "Delete conversation",
            f"Delete the conversation “{title}”? Its file is removed from {self.store.folder}.",
        )
        return answer == QMessageBox.StandardButton.Yes

    def _ask(self) -> bool:
        self.draft = ReplyDraft()
        self._save()
        self.status.set_status("waiting for the model", WARN)
        self.redraw()
        self._update_buttons()
        self.submit_requested.emit(self.conversation.request())
        return True

    # -- the bridge's values (GUI thread) -----------------------------------------------

    def submission_refused(self) -> None:
        """The bridge did not take the request: the user turn stays, without a reply."""
        self.draft = None
        self.status.set_status("not sent", WARN)
        self.redraw()
        self._update_buttons()

    def run_started(self, request_id: str) -> None:
        if self.draft is not None and self.draft.request_id is None:
            self.draft.request_id = request_id
            self.status.set_status("writing", OK)

    def add_text(self, chunk: TextChunk) -> None:
        draft = self.draft
        if draft is None or draft.request_id not in (None, chunk.request_id):
            return
        draft.add(chunk.text, finished=chunk.finished, prompt=chunk.prompt)
        if not self._redraw.isActive():
            self._redraw.start()

    def finished(self, outcome: RunOutcome) -> None:
        draft = self.draft
        if draft is None or (
            outcome.request_id is not None and draft.request_id not in (None, outcome.request_id)
        ):
            return
        status: Status = _OUTCOME_STATUS.get(outcome.status, "failed")
        self.draft = None
        self.reply_chunks = draft.chunks
        self.conversation = self.conversation.with_reply(
            draft.text,
            status,
            prompt=draft.prompt,
            error=outcome.message if status == "failed" else None,
        )
        self._save()
        colours = {"done": OK, "stopped": NEUTRAL, "failed": WARN}
        self.status.set_status({"done": "replied"}.get(status, status), colours[status])
        self.redraw()
        self._update_buttons()

    # -- drawing and saving --------------------------------------------------------------

    def redraw(self) -> None:
        started = time.perf_counter()
        self._redraw.stop()
        self.title.setText(self.conversation.title)
        note = "waiting for the model to load" if self.waiting_for_load else "writing"
        draft = self.draft
        heard, spoken, voice_note = self.voice_pending
        if draft is None and spoken is not None:
            draft, note = ReplyDraft(text=spoken), voice_note
        hint = (
            "Press Talk and speak: the assistant answers aloud."
            if self.voice.voice
            else "Write a message below and press Send (Ctrl+Enter). The reply streams in as "
            "the model writes it."
        )
        self.transcript.setHtml(
            transcript_html(
                self.conversation,
                draft,
                self.palette(),
                draft_note=note,
                heard=heard,
                empty_hint=hint,
            )
        )
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())
        self._update_buttons()
        cost_ms = (time.perf_counter() - started) * 1000
        self._redraw.setInterval(max(REDRAW_MS, min(MAX_REDRAW_MS, round(cost_ms * REDRAW_SHARE))))

    def _save(self) -> None:
        if not self.conversation.turns:
            return
        try:
            self.store.save(self.conversation)
        except ConversationError as exc:
            self.problem.emit(ErrorInfo("The conversation was not saved", str(exc), kind="warning"))
        self.refresh_history()

    def set_voice(self, voice: bool) -> None:
        """A voice-chat pipeline is open (the microphone replaces the message box; its system
        prompt is the pipeline's own), or another (the microphone offers to open one)."""
        self.voice.set_voice(voice)
        for widget in (
            self.composer,
            self.send_button,
            self.stop_button,
            self.regenerate_button,
            self.dictate_button,
            self.system_label,
            self.system_prompt,
            self.status,
        ):
            widget.setVisible(not voice)
        if not voice:
            self.dictate_meter.hide()
        self.redraw()

    def show_voice(
        self,
        conversation: Conversation,
        heard: str | None,
        reply: str | None,
        note: str,
        *,
        save: bool = False,
    ) -> None:
        """A spoken conversation's turns and pending bubbles; ``save`` after a turn."""
        self.conversation = conversation
        self.voice_pending = (heard, reply, note)
        if save:
            self._save()
        if not self._redraw.isActive():
            self._redraw.start()

    def set_talking(self, talking: bool) -> None:
        if talking == self.talking:
            return
        self.talking = talking
        if not talking:
            self.voice_pending = (None, None, "")
            self.redraw()
        self._update_buttons()

    def set_dictating(self, state: str) -> None:
        """Dictate's look: ``recording`` (checked, the meter shown), ``transcribing`` (busy)
        or ``idle``."""
        self.dictate_button.blockSignals(True)
        self.dictate_button.setChecked(state == "recording")
        self.dictate_button.blockSignals(False)
        self.dictate_button.setEnabled(state != "transcribing")
        self.dictate_button.setText(
            {"recording": "Stop dictating", "transcribing": "Transcribing…"}.get(state, "Dictate")
        )
        self.dictate_meter.setVisible(state == "recording")
        if state != "recording":
            self.dictate_meter.clear()

    def insert_dictation(self, text: str) -> None:
        """Add dictated ``text`` to the end of the message box, after a space (never sends
        it); the cursor is left after it, so the next dictation continues the message."""
        text = text.strip()
        if not text:
            return
        cursor = self.composer.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        before = self.composer.toPlainText()
        if before and not before[-1].isspace():
            text = " " + text
        cursor.insertText(text)
        self.composer.setTextCursor(cursor)
        self.composer.setFocus()

    def refresh_history(self) -> None:
        listing = self.store.listing()
        current = self.conversation.id
        self.history.blockSignals(True)
        self.history.clear()
        for summary in listing.conversations:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(summary.updated))
            item = QListWidgetItem(f"{summary.title}\n{summary.pipeline} · {when}")
            item.setData(Qt.ItemDataRole.UserRole, summary.id)
            item.setToolTip(str(summary.path))
            self.history.addItem(item)
            if summary.id == current:
                self.history.setCurrentItem(item)
        self.history.blockSignals(False)
        if listing.problems:
            names = ", ".join(problem.path.name for problem in listing.problems)
            unreported = [p for p in listing.problems if str(p) not in self._reported]
            self._reported.update(str(problem) for problem in unreported)
            if unreported:
                self.problem.emit(
                    ErrorInfo(
                        "A conversation file could not be read",
                        "\n".join(str(problem) for problem in unreported),
                        kind="warning",
                    )
                )
            self.history_note.setText(
                f"{len(listing.problems)} file(s) could not be read and were left as they "
                f"are: {names}"
            )
            self.history_note.setToolTip("\n".join(str(problem) for problem in listing.problems))
        else:
            self.history_note.setText("")
            self.history_note.setToolTip("")
        self._update_buttons()
