"""A SAM emulator: template.yaml deployed on a moto server, with its functions bound to their events."""
