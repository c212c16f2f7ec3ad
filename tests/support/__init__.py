"""What tests of every tier share: fakes of the ports, a clock, the canonical events, handler loading.

Test modules import these by name; fixtures stay in `conftest.py` files, which build them from here.
"""
