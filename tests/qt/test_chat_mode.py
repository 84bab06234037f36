"""The Chat tab: a conversation on the tiny model through the window's own controls, its plots, map and table."""

from tests.qt.conftest import load, tab


def send(qtbot, window, text: str, turns: int) -> None:
    window.modes["chat"].view.message.setPlainText(text)
    with qtbot.waitSignal(window.modes["chat"].sigTurnDone, timeout=60000) as blocker:
        assert window.start_run() is not None  # Ctrl+Enter in this mode sends the message
    assert blocker.args == [turns], window.last_error


def test_a_chat_with_a_bounded_cache_is_drawn_by_turn_and_role(qtbot, window):
    load(qtbot, window)
    window.set_mode("chat")
    assert window.views.tabText(tab(window, "chat")) == "Chat" and not window.runs_dock.isVisible()
    controls, mode = window.controls, window.modes["chat"]
    controls.settings_panel.max_new_tokens.setValue(6)
    assert controls.strategy_panel.set_current("sink")
    controls.strategy_panel.set_option("window", 24)
    mode.view.system.setText("Be brief.")
    mode.view.message.setPlainText("   ")
    assert not mode.send() and "empty" in window.last_error
    for i, text in enumerate(["Hello there.", "What is a cache?", "And a sink?"]):
        send(qtbot, window, text, i + 1)
    turns = mode.trace.turns
    assert mode.view.table.rowCount() == 3 and turns[2].evicted > 0
    assert "evicting" in mode.view.table.item(2, 9).text()
    layers = window.model.card["num_layers"]
    assert mode.view.cache_map.codes.shape == (layers, turns[2].end)  # the last token is not fed yet: unseen
    assert (mode.view.cache_map.codes[:, 4:10] == 1).all()  # the first turn's message is evicted, the sinks kept
    assert len(mode.view.memory_plot.turn_lines.lines) == 3
    assert "user" in mode.view.transcript.toPlainText() and "Be brief." in mode.view.transcript.toPlainText()

    with qtbot.waitSignal(mode.sigTurnDone, timeout=60000):
        mode.view.regenerate_button.click()
    assert mode.trace.turns[3].kind == "regenerate"
    with qtbot.waitSignal(mode.chatter.sigNewChat, timeout=60000):
        mode.view.new_chat_button.click()
    send(qtbot, window, "Hello there.", 5)
    assert mode.trace.turns[4].kept == mode.trace.prefix.tokens and mode.trace.turns[4].chat == 1

    path = window.modes["chat"].save(window.settings.fileName() + ".conversation.json")
    window.set_mode("local")
    assert window.runs_dock.isVisible()
    from kvviz.files.formats import read_kept

    assert window.show_kept(read_kept(path)) is not None and window.mode.key == "chat"
    window.redraw()
    assert "opened from a file" in mode.view.header.text() and mode.view.table.rowCount() == 5
    assert not mode.view.regenerate_button.isEnabled()  # a kept chat is shown; the next message begins a new one


def test_a_closed_window_loses_no_finished_turn(qtbot, window, tmp_path, monkeypatch):
    """Closed while answering, a chat never saved is kept in the folder About names, and the file another chat was
    saved to is left as it was (a chat saved before is written again to its own file)."""
    from kvviz.files import conversation as conversation_file
    from kvviz.qt import unsaved as unsaved_folder

    monkeypatch.setenv("KVVIZ_UNSAVED_DIR", str(tmp_path))
    load(qtbot, window)
    window.set_mode("chat")
    window.controls.settings_panel.max_new_tokens.setValue(3)
    send(qtbot, window, "Hello there.", 1)
    from kvviz.files.formats import read_kept

    (journal,) = (tmp_path / "unsaved").glob("chat-*.json.journal")  # each finished turn, on disk at once
    assert [m.content for m in read_kept(journal).messages if m.role == "user"] == ["Hello there."]
    saved = window.modes["chat"].save(tmp_path / "chat.json")
    window.modes["chat"].view.system.setText("Be brief.")  # a changed system prompt begins another conversation
    window.modes["chat"].view.message.setPlainText("What is a cache?")
    window.start_run()
    chatter = window.modes["chat"].chatter
    qtbot.waitUntil(lambda: chatter.conversation.system == "Be brief." and chatter.conversation.turn is not None)
    folder = tmp_path / "unsaved"
    about = window.help.show_about().text()
    assert str(folder) in about and unsaved_folder.RULE in about
    window.close()  # at once, as the close button does: the answer stops at its step in progress

    (kept,) = folder.iterdir()  # the journals gone with the window that closed: the chat kept whole
    unsaved = conversation_file.load(kept)
    roles = [(m.role, m.content) for m in unsaved.messages]
    assert roles[:2] == [("system", "Be brief."), ("user", "What is a cache?")]
    assert len(unsaved.turns) == 1 and unsaved.cancelled == unsaved.turns[0].cancelled
    assert [m.content for m in conversation_file.load(saved).messages if m.role == "user"] == ["Hello there."]


def test_a_switch_refused_mid_answer_says_why_and_the_answer_goes_on(qtbot, window):
    """KVzip cannot take over a live cache: the engine's refusal, by name, above the views; the answer being generated
    is not taken for finished (the chat stays busy until it is) and ends as it would have."""
    load(qtbot, window)
    window.set_mode("chat")
    mode, picker = window.modes["chat"], window.controls.strategy_panel
    window.controls.settings_panel.max_new_tokens.setValue(120)
    mode.view.message.setPlainText("Hello there, tell me a long story.")
    with qtbot.waitSignal(mode.sigTurnDone, timeout=180000):
        assert window.start_run() is not None
        qtbot.waitUntil(lambda: mode.latest_step is not None and mode.latest_step.index >= 3, timeout=60000)
        assert picker.set_current("kvzip")
        with qtbot.waitSignal(mode.chatter.sigSwitchRefused, timeout=60000):
            assert window.switch_strategy()
        qtbot.waitUntil(lambda: "kvzip scores a prompt" in window.last_error, timeout=5000)
        refused_at = mode.latest_step.index
        assert window.last_error.startswith("Cannot switch from 'dynamic' to 'kvzip': ") and mode.busy
        qtbot.waitUntil(lambda: mode.latest_step.index >= refused_at + 3, timeout=60000)  # it decodes on
    (turn,) = mode.trace.turns
    assert not turn.cancelled and mode.chatter.conversation.run.choice.name == "dynamic"
