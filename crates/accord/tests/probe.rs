//! Probing point-to-point messages: what the next receive would take, without taking it, in
//! the order receives are served, over TCP and in-process transports.

use accord::testing::{run_tcp_world, run_world};
use accord::{Communicator, DataType, MessageInfo};
use std::time::Duration;

fn info(dtype: DataType, count: usize) -> MessageInfo {
    MessageInfo { dtype, count }
}

/// Rank 0 sends three messages with tag 7 and an empty one with tag 8; rank 1 probes each
/// before receiving it.
fn exchange(comm: Communicator) {
    let big: Vec<f32> = (0..300_007).map(|i| i as f32).collect(); // several frames
    match comm.rank() {
        0 => {
            comm.send(&[1.5f64, 2.5, 3.5, 4.5, 5.5][..], 1, 7).unwrap();
            comm.send(&[7i32, 8, 9][..], 1, 7).unwrap();
            comm.send(&big[..], 1, 7).unwrap();
            comm.send(&[0u8; 0][..], 1, 8).unwrap();
            comm.barrier().unwrap();
        }
        1 => {
            assert_eq!(
                comm.iprobe(0, 9).unwrap(),
                None,
                "nothing was sent with tag 9"
            );
            assert_eq!(comm.probe(0, 7).unwrap(), info(DataType::F64, 5));
            // Probing does not take it.
            assert_eq!(comm.probe(0, 7).unwrap(), info(DataType::F64, 5));
            let mut a = [0f64; 5];
            comm.recv(&mut a[..], 0, 7).unwrap();
            assert_eq!(a, [1.5, 2.5, 3.5, 4.5, 5.5]);
            assert_eq!(comm.probe(0, 7).unwrap(), info(DataType::I32, 3));
            let mut b = [0i32; 3];
            comm.recv(&mut b[..], 0, 7).unwrap();
            assert_eq!(b, [7, 8, 9]);
            let m = comm.probe(0, 7).unwrap();
            assert_eq!(m, info(DataType::F32, big.len()));
            let mut c = vec![0f32; m.count];
            comm.recv(&mut c[..], 0, 7).unwrap();
            assert_eq!(c, big);
            assert_eq!(comm.probe(0, 8).unwrap(), info(DataType::U8, 0));
            let mut d = [0u8; 0];
            comm.recv(&mut d[..], 0, 8).unwrap();
            comm.barrier().unwrap();
            // Everything was taken.
            assert_eq!(comm.iprobe(0, 7).unwrap(), None);
        }
        _ => comm.barrier().unwrap(),
    }
}

#[test]
fn probe_sees_the_next_message_over_tcp() {
    run_tcp_world(3, Duration::from_secs(30), exchange);
}

#[test]
fn probe_sees_the_next_message_in_process() {
    run_world(2, exchange);
}

#[test]
fn a_probe_with_no_message_times_out_naming_the_peer() {
    let errs = run_tcp_world(2, Duration::from_millis(300), |comm| {
        if comm.rank() == 0 {
            std::thread::sleep(Duration::from_millis(900)); // present, sending nothing
            return None;
        }
        Some(comm.probe(0, 3).unwrap_err())
    });
    match errs[1].as_ref().unwrap() {
        accord::Error::Timeout {
            op, waiting_for, ..
        } => {
            assert_eq!(op, "probe(tag 3)");
            assert_eq!(waiting_for, &[0]);
        }
        e => panic!("expected a timeout, got {e}"),
    }
}
