"""Running a call on this rank: the executor that runs a schedule's steps over a transport
(:mod:`.executor`), the rank's runtime context that holds the card, the engine and the flight
recorder (:mod:`.context`), and the issuing path with its streams and guard (:mod:`.issuing`)."""
