"""The ``tailguard`` command: one module per command (arguments and printing only) over the
room that does the work, plus the options and progress display the commands share."""
