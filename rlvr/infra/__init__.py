"""Infrastructure shared by the services: the embedded NATS server (`nats_server`), the JetStream
stream and event consumers (`events`), and the SQLModel store (`schema`, `store`).

Nothing is re-exported here, so importing one piece (say, the NATS launcher in `rlvr up`) does not
pull in SQLAlchemy or nats-py.
"""
