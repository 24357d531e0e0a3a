"""What went wrong, worded for the person who must act: domain errors with a reason
and the numbers, the one reason -> gRPC status table, rich status details, and
the human units the messages use. Pure: no servers, no channels.
"""
