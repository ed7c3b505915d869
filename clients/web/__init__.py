"""The web console: the spec's pages in a browser, served by `rlvr web` (and by `rlvr up`).

A client of the scheduler and the benchmark service through the SDK, like the CLI: it keeps no
state and imports no service code. Pages are rendered on the server (Starlette + Jinja2) and read
without JavaScript; a small script (static/console.js, no build step) adds live updates over
server-sent events, the form's hints and its live Training Summary.

    app.py       routes, error pages, static files       console.py  what every page shares
    jobs.py      jobs list, job page, actions            train.py    New Training + Start a loop
    loops.py     loops list, Training Loop page          evals.py    evaluations, leaderboard
    limits.py    ranges and defaults, asked of the server  forms.py  form fields <-> JobSpec/LoopSpec
    live.py      SSE streams over WatchJob / WatchLoop   views.py    figures from the CLI's views
    csrf.py      CSRF tokens for every POST              downloads.py  the adapter as a streamed zip
"""
