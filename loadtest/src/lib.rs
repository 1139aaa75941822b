//! The load-test harness for idlegate. Its client, schedule and report arrive with the
//! load-test issue; until then this workspace member holds nothing.
