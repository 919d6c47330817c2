use super::*;
use crate::decode_frame;

#[test]
fn create_round_trips() {
    let spec = TableSpec {
        name: "emb".into(),
        dim: 128,
        optimizer: Optimizer::Adagrad,
        missing: Missing::Init,
        lr: 0.5,
        seed: 7,
    };
    let mut out = Vec::new();
    encode_create(&mut out, 9, 1, &spec);
    let f = decode_frame(&out).unwrap();
    let PsRequest::Create(rest) = decode_request(&f).unwrap() else {
        panic!("not a create")
    };
    assert_eq!(decode_create(rest).unwrap(), spec);
}

#[test]
fn pull_and_push_round_trip() {
    let mut out = Vec::new();
    let dest = PullDest {
        region: [3; 24],
        offset: 4096,
    };
    encode_pull(&mut out, 1, 0, 5, &[1, 2, u64::MAX], Some(&dest));
    let f = decode_frame(&out).unwrap();
    match decode_request(&f).unwrap() {
        PsRequest::Pull {
            table,
            keys,
            dest: d,
        } => {
            assert_eq!(table, 5);
            assert_eq!(keys.len(), 24);
            assert_eq!(key_at(keys, 2), u64::MAX);
            assert_eq!(d, Some(dest));
        }
        other => panic!("{other:?}"),
    }
    out.clear();
    encode_push(
        &mut out,
        2,
        0,
        5,
        PushMode::Gradient,
        &[4, 5],
        &[1.0, 2.0, 3.0, 4.0],
        None,
    );
    let f = decode_frame(&out).unwrap();
    match decode_request(&f).unwrap() {
        PsRequest::Push {
            mode, keys, values, ..
        } => {
            assert_eq!(mode, PushMode::Gradient);
            assert_eq!(key_at(keys, 1), 5);
            let mut v = [0f32; 4];
            f32s_from_le(values, &mut v);
            assert_eq!(v, [1.0, 2.0, 3.0, 4.0]);
        }
        other => panic!("{other:?}"),
    }
    // With a request id, which comes back whole and leaves the keys and
    // values where they were.
    out.clear();
    let id = PushId {
        client: 0xC1,
        seq: 7,
    };
    encode_push(
        &mut out,
        3,
        0,
        5,
        PushMode::Gradient,
        &[4, 5],
        &[1.0, 2.0, 3.0, 4.0],
        Some(id),
    );
    let f = decode_frame(&out).unwrap();
    match decode_request(&f).unwrap() {
        PsRequest::Push {
            keys,
            values,
            request,
            ..
        } => {
            assert_eq!(request, Some(id));
            assert_eq!((key_at(keys, 0), key_at(keys, 1)), (4, 5));
            assert_eq!(values.len(), 16);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn refuses_inconsistent_bodies() {
    let mut out = Vec::new();
    encode_pull(&mut out, 1, 0, 5, &[1, 2], None);
    // Claim three keys: the body no longer matches.
    out[6] = 3;
    let body_start = fabrickv_types::limits::FRAME_HEADER_BYTES;
    let crc = crate::checksum::crc32c(&out[body_start..]);
    out[20..24].copy_from_slice(&crc.to_le_bytes());
    assert!(decode_request(&decode_frame(&out).unwrap()).is_err());
    // A push whose values are not whole vectors.
    out.clear();
    encode_push(
        &mut out,
        2,
        0,
        5,
        PushMode::Overwrite,
        &[4, 5],
        &[1.0, 2.0, 3.0],
        None,
    );
    assert!(decode_request(&decode_frame(&out).unwrap()).is_err());
}

#[test]
fn descriptors_round_trip() {
    let d = TableDesc {
        id: 3,
        spec: TableSpec::new("t", 4),
        items: 10,
    };
    let mut out = Vec::new();
    encode_list_reply(&mut out, 1, 0, &[d.clone(), d.clone()]);
    let f = decode_frame(&out).unwrap();
    let r = decode_reply(&f).unwrap();
    assert_eq!(decode_list(r.rest).unwrap(), vec![d.clone(), d]);
}

#[test]
fn table_specs_parse_from_text() {
    let s = TableSpec::parse("emb:64:opt=adagrad:lr=0.5:missing=init:seed=3").unwrap();
    assert_eq!(
        s,
        TableSpec {
            name: "emb".into(),
            dim: 64,
            optimizer: Optimizer::Adagrad,
            missing: Missing::Init,
            lr: 0.5,
            seed: 3
        }
    );
    assert_eq!(TableSpec::parse("t:8").unwrap(), TableSpec::new("t", 8));
    for bad in [
        "t",
        "t:x",
        "t:0",
        "t:8:lr",
        "t:8:opt=adam",
        ":8",
        "t:8:color=red",
    ] {
        assert!(TableSpec::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn initializer_is_deterministic_and_in_range() {
    let mut a = [0f32; 64];
    let mut b = [0f32; 64];
    init_vector(1, 42, &mut a);
    init_vector(1, 42, &mut b);
    assert_eq!(a, b);
    init_vector(2, 42, &mut b);
    assert_ne!(a, b, "the seed matters");
    assert!(a.iter().all(|x| (-INIT_RANGE..INIT_RANGE).contains(x)));
    assert!(a.iter().any(|x| *x != a[0]), "elements differ");
}

#[test]
fn frame_capacity_holds_the_vectors() {
    for dim in [1, 128, 1000, PS_DIM_MAX as u32] {
        let n = pull_keys_per_frame(dim);
        assert!(PS_PREFIX_BYTES + bitmap_bytes(n) + n * dim as usize * 4 <= FRAME_BODY_BYTES_MAX);
        let n = push_keys_per_frame(dim);
        assert!(
            PS_PREFIX_BYTES + PUSH_FIXED_BYTES + n * (8 + dim as usize * 4) <= FRAME_BODY_BYTES_MAX
        );
    }
    assert_eq!(pull_keys_per_frame(128), PS_KEYS_PER_REQUEST_MAX);
}
