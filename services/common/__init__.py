"""What every service runs on: the gRPC server runner (health, reflection, signals, settings) and
opening the store and the event bus at start. Services may import this; it imports no service."""
